//! Whether an executable can take the shim (`DYLD_INSERT_LIBRARIES`), read from
//! the file before it fails: what `validate`, `explain --path` and `doctor` say
//! for an unlock rule's exact path.
//!
//! dyld ignores `DYLD_INSERT_LIBRARIES` for a restricted process: setuid/setgid,
//! `CS_RESTRICT`, SIP-protected (platform) binaries, and the Hardened Runtime
//! without `com.apple.security.cs.allow-dyld-environment-variables`; library
//! validation (`CS_REQUIRE_LV`, or the Hardened Runtime without
//! `com.apple.security.cs.disable-library-validation`) refuses a library not
//! signed by Apple or the executable's team, which the shim is not. Read in
//! apple-oss-distributions/dyld (dyld-1378) `dyld/DyldProcessConfig.cpp`:
//! `ProcessConfig::Security::Security` takes AMFI's answer for the process
//! (`getAMFI` → `amfi_check_dyld_policy_self`, given `isRestricted()` of the main
//! executable) and, on macOS, unless AMFI allows the print, path or shared-cache
//! variables, `pruneEnvVars` deletes every `DYLD_*` variable, so the process and its
//! children never see `DYLD_INSERT_LIBRARIES`. The flags' values are
//! apple-oss-distributions/xnu (xnu-11417.101.15) `osfmk/kern/cs_blobs.h`. Which
//! executables AMFI restricts (the entitlements' effect) is AMFI's, not in those
//! sources: the macOS workflow's `shim_fit` step checks /bin/ls and /usr/bin/sudo.
//! And the shim has only arm64, arm64e and x86_64 slices.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{slices, Slice, CS_REQUIRE_LV, CS_RESTRICT, CS_RUNTIME};

/// The architectures the shim is built for.
pub const SHIM_ARCHES: [&str; 3] = ["arm64", "arm64e", "x86_64"];

const ALLOW_DYLD_ENV: &str = "com.apple.security.cs.allow-dyld-environment-variables";
const DISABLE_LV: &str = "com.apple.security.cs.disable-library-validation";

/// Paths System Integrity Protection covers (and `/usr/local`, which it does not).
const SIP_PREFIXES: [&str; 4] = ["/System/", "/usr/", "/bin/", "/sbin/"];

/// One reason the shim will not load, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// A short name: `setuid`, `sip`, `restricted`, `hardened-runtime`,
    /// `library-validation`, `no-slice`.
    pub kind: &'static str,
    /// What is wrong, naming the path.
    pub message: String,
    /// What to do.
    pub fix: String,
}

/// Every reason the executable at `path` cannot take the shim (empty: it can, or
/// it is not a Mach-O, e.g. a script, whose interpreter is what runs).
#[must_use]
pub fn check(path: &Path) -> Vec<Unfit> {
    // SIP exists on macOS only: on Linux a /usr path is an ordinary one.
    check_on(path, cfg!(target_os = "macos"))
}

/// [`check`], with SIP's paths considered or not.
#[must_use]
pub fn check_on(path: &Path, sip: bool) -> Vec<Unfit> {
    let mut out = Vec::new();
    let shown = path.display();
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o6000 != 0 {
            let which = if mode & 0o4000 != 0 {
                "setuid"
            } else {
                "setgid"
            };
            out.push(Unfit {
                kind: "setuid",
                message: format!("{shown} is {which}: dyld ignores DYLD_INSERT_LIBRARIES for it"),
                fix: format!("run a copy without the {which} bit (chmod u-s,g-s), or match the process it starts"),
            });
        }
    }
    let text = path.to_string_lossy();
    if sip && SIP_PREFIXES.iter().any(|p| text.starts_with(p)) && !text.starts_with("/usr/local/") {
        out.push(Unfit {
            kind: "sip",
            message: format!("{shown} is SIP-protected: dyld strips DYLD_* variables for it"),
            fix: "install the program outside the system paths (e.g. under /usr/local or /opt) and match that path".to_owned(),
        });
    }
    let Ok(bytes) = std::fs::read(path) else {
        return out;
    };
    let Ok(slices) = slices(&bytes) else {
        return out;
    };
    out.extend(check_slices(path, &slices));
    out
}

/// The Mach-O part of [`check`].
#[must_use]
pub fn check_slices(path: &Path, slices: &[Slice]) -> Vec<Unfit> {
    let shown = path.display();
    let mut out = Vec::new();
    let usable: Vec<&Slice> = slices
        .iter()
        .filter(|s| SHIM_ARCHES.contains(&s.arch.as_str()))
        .collect();
    if usable.is_empty() {
        let arches: Vec<&str> = slices.iter().map(|s| s.arch.as_str()).collect();
        out.push(Unfit {
            kind: "no-slice",
            message: format!(
                "{shown} has no slice the shim has (it has {}; the shim has {})",
                arches.join(", "),
                SHIM_ARCHES.join(", ")
            ),
            fix: "use a build of the program for arm64 (Apple silicon guests) or x86_64".to_owned(),
        });
        return out;
    }
    // The slice that runs on an Apple silicon guest: arm64e, else arm64, else x86_64.
    let slice = ["arm64e", "arm64", "x86_64"]
        .iter()
        .find_map(|a| usable.iter().find(|s| s.arch == *a))
        .copied()
        .unwrap_or(usable[0]);
    let flags = slice.cs_flags.unwrap_or(0);
    let runtime = flags & CS_RUNTIME != 0;
    if flags & CS_RESTRICT != 0 {
        out.push(Unfit {
            kind: "restricted",
            message: format!(
                "{shown} is signed restricted (CS_RESTRICT): dyld ignores DYLD_* variables"
            ),
            fix: "re-sign it without the restrict flag, or use a build that is not restricted"
                .to_owned(),
        });
    }
    if runtime && !slice.entitled(ALLOW_DYLD_ENV) {
        out.push(Unfit {
            kind: "hardened-runtime",
            message: format!(
                "{shown} ({}) uses the Hardened Runtime without {ALLOW_DYLD_ENV}: dyld ignores DYLD_INSERT_LIBRARIES",
                slice.arch
            ),
            fix: format!(
                "re-sign it ad hoc with {ALLOW_DYLD_ENV} and {DISABLE_LV} \
                 (codesign --force --options runtime --entitlements E.plist -s - PATH), \
                 or use a build without the Hardened Runtime (e.g. llama.cpp built from source)"
            ),
        });
    }
    if flags & CS_REQUIRE_LV != 0 || (runtime && !slice.entitled(DISABLE_LV)) {
        out.push(Unfit {
            kind: "library-validation",
            message: format!(
                "{shown} ({}) enforces library validation: it refuses the shim, which is not signed by Apple or its team",
                slice.arch
            ),
            fix: format!("re-sign it with {DISABLE_LV} (and without --options library), or use a build without it"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{fat, thin, Sign};
    use super::super::{CPU_SUBTYPE_ARM64E, CPU_TYPE_ARM64, CPU_TYPE_X86_64};
    use super::*;

    fn kinds(bytes: &[u8]) -> Vec<&'static str> {
        check_slices(Path::new("/opt/x"), &slices(bytes).unwrap())
            .into_iter()
            .map(|u| u.kind)
            .collect()
    }

    #[test]
    fn hardened_without_entitlements_is_named_twice_and_with_both_is_fine() {
        let ollama = thin(CPU_TYPE_ARM64, 0, Some(&Sign::new(CS_RUNTIME)));
        assert_eq!(kinds(&ollama), ["hardened-runtime", "library-validation"]);
        let entitled = thin(
            CPU_TYPE_ARM64,
            0,
            Some(
                &Sign::new(CS_RUNTIME)
                    .entitle(ALLOW_DYLD_ENV)
                    .entitle(DISABLE_LV),
            ),
        );
        assert!(kinds(&entitled).is_empty());
        assert!(kinds(&thin(CPU_TYPE_ARM64, 0, Some(&Sign::new(0)))).is_empty());
    }

    #[test]
    fn require_lv_and_restrict_are_named() {
        let lv = thin(
            CPU_TYPE_ARM64,
            CPU_SUBTYPE_ARM64E,
            Some(&Sign::new(CS_REQUIRE_LV)),
        );
        assert_eq!(kinds(&lv), ["library-validation"]);
        let restricted = thin(CPU_TYPE_X86_64, 3, Some(&Sign::new(CS_RESTRICT)));
        assert_eq!(kinds(&restricted), ["restricted"]);
    }

    #[test]
    fn a_file_with_no_slice_the_shim_has_is_named() {
        let ppc = fat(&[thin(0x12, 0, None)]);
        assert_eq!(kinds(&ppc), ["no-slice"]);
    }

    #[test]
    fn setuid_and_sip_paths_are_named_from_the_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("tool");
        std::fs::write(&exe, thin(CPU_TYPE_ARM64, 0, None)).unwrap();
        assert!(check(&exe).is_empty());
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
        assert_eq!(
            check(&exe).iter().map(|u| u.kind).collect::<Vec<_>>(),
            ["setuid"]
        );
        assert!(check_on(Path::new("/usr/bin/true"), true)
            .iter()
            .any(|u| u.kind == "sip"));
        assert!(!check_on(Path::new("/usr/local/bin/x"), true)
            .iter()
            .any(|u| u.kind == "sip"));
    }
}
