//! A macOS 14 guest: Metal there reads stale data from `mmap`ed files, so
//! llama.cpp (which maps model files by default) computes with wrong weights
//! until it runs with `--no-mmap` (unslothai/llama.cpp#37).
//!
//! The version comes from `sw_vers -productVersion` (or `sysctl -n
//! kern.osproductversion`), "guest" from `sysctl -n kern.hv_vmm_present`: 1
//! inside a virtual machine, the test Apple's own frameworks make
//! (`sysctlbyname("kern.hv_vmm_present", ...) == 1`, e.g. in
//! com.apple.Transparency's code). Verify on a Mac: a Virtualization.framework
//! guest reports 1, bare metal 0.

use std::path::Path;
use std::process::Command;

use super::check::{Check, Status};

const NAME: &str = "guest";

/// The check for this machine: n/a off macOS or under `--root`.
#[must_use]
pub fn metal_mmap(root: &Path) -> Check {
    if !cfg!(target_os = "macos") || root != Path::new("/") {
        return Check::new(
            NAME,
            Status::NotApplicable,
            "macOS guest checks: macOS only",
        );
    }
    let output = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let version = output("sw_vers", &["-productVersion"])
        .or_else(|| output("sysctl", &["-n", "kern.osproductversion"]));
    let vmm = output("sysctl", &["-n", "kern.hv_vmm_present"]);
    metal_mmap_from(version.as_deref(), vmm.as_deref())
}

/// Judges a product version (`14.6.1`) and `kern.hv_vmm_present` (`1` in a VM).
#[must_use]
pub fn metal_mmap_from(product_version: Option<&str>, hv_vmm_present: Option<&str>) -> Check {
    let major = product_version
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse::<u32>().ok());
    let guest = hv_vmm_present.map(str::trim) == Some("1");
    match (major, guest) {
        (None, _) => Check::new(
            NAME,
            Status::Warn,
            format!(
                "cannot tell the macOS version (sw_vers said {:?})",
                product_version.unwrap_or("nothing")
            ),
        ),
        (Some(14), true) => Check::new(
            NAME,
            Status::Warn,
            "a macOS 14 guest: Metal reads stale data from mmap'd files here, so llama.cpp computes with wrong weights (unslothai/llama.cpp#37)",
        )
        .fix("run llama.cpp with --no-mmap (llama-server, llama-cli, llama-bench ...), or upgrade the guest to macOS 15 or later"),
        (Some(major), true) => Check::new(
            NAME,
            Status::Ok,
            format!("a macOS {major} guest: no known mmap issue"),
        ),
        (Some(major), false) => Check::new(
            NAME,
            Status::Ok,
            format!("macOS {major}, not a virtual machine"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_macos_14_guest_then_doctor_says_to_run_llama_cpp_with_no_mmap() {
        let c = metal_mmap_from(Some("14.6.1"), Some("1\n"));
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("unslothai/llama.cpp#37"));
        assert!(c.fix.contains("--no-mmap"));
    }

    #[test]
    fn given_another_version_or_bare_metal_then_no_warning() {
        assert_eq!(metal_mmap_from(Some("15.1"), Some("1")).status, Status::Ok);
        assert_eq!(
            metal_mmap_from(Some("14.6.1"), Some("0")).status,
            Status::Ok
        );
        assert_eq!(metal_mmap_from(Some("14.6.1"), None).status, Status::Ok);
        assert_eq!(metal_mmap_from(None, Some("1")).status, Status::Warn);
        assert_eq!(
            metal_mmap(Path::new("/elsewhere")).status,
            Status::NotApplicable
        );
    }
}
