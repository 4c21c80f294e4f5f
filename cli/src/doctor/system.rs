//! System Integrity Protection (macOS): `csrutil status`.

use std::path::Path;

use super::check::{Check, Status};

/// What `csrutil status` says; n/a on Linux or under `--root`.
pub fn sip(root: &Path) -> Check {
    if !cfg!(target_os = "macos") || root != Path::new("/") {
        return Check::new(
            "SIP",
            Status::NotApplicable,
            "System Integrity Protection: macOS only",
        );
    }
    match std::process::Command::new("csrutil").arg("status").output() {
        Ok(out) => sip_from(&String::from_utf8_lossy(&out.stdout)),
        Err(e) => Check::new("SIP", Status::Warn, format!("cannot run csrutil: {e}")),
    }
}

/// Judges `csrutil status` output.
#[must_use]
pub fn sip_from(output: &str) -> Check {
    let text = output.trim();
    if text.contains("status: enabled") {
        Check::new(
            "SIP",
            Status::Ok,
            "enabled: dyld drops DYLD_* for system binaries, so start workloads directly, not through /bin/sh or env",
        )
    } else if text.contains("status: disabled") || text.contains("Custom Configuration") {
        Check::new("SIP", Status::Warn, format!("not fully enabled: {text}"))
            .fix("re-enable it from recoveryOS: csrutil enable")
    } else {
        Check::new(
            "SIP",
            Status::Warn,
            format!("unrecognised csrutil output: {text}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrutil_output_is_judged() {
        assert_eq!(
            sip_from("System Integrity Protection status: enabled.\n").status,
            Status::Ok
        );
        assert_eq!(
            sip_from("System Integrity Protection status: disabled.\n").status,
            Status::Warn
        );
    }
}
