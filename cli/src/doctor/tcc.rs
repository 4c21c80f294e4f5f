//! Full Disk Access: can metaliftd read executables in TCC-protected folders?
//!
//! Only the daemon can answer for itself (TCC grants are per process), so it
//! probes at start (`metalift_daemon::service::full_disk_access`: it opens the system
//! TCC database) and reports it in its status; this check reads that answer.
//! Without the grant, processes run from `~/Desktop`, `~/Documents`,
//! `~/Downloads`, removable or network volumes are decided without their
//! signature or hash (`identity unreadable: permission denied` in the audit log).

use std::path::Path;

use super::check::{Check, Status};
use metalift_daemon::service::status::StatusReport;

/// How to grant it, by MDM or by hand (the daemon's path is the pkg's).
pub const GRANT: &str = "grant metaliftd Full Disk Access: by MDM, a PPPC profile (com.apple.TCC.configuration-profile-policy) allowing SystemPolicyAllFiles for /usr/local/metalift/bin/metaliftd (IdentifierType path); or by hand, System Settings > Privacy & Security > Full Disk Access, add /usr/local/metalift/bin/metaliftd; then restart it: sudo launchctl kickstart -k system/com.metalift.metaliftd";

/// The check for this machine: n/a off macOS or under `--root`.
#[must_use]
pub fn full_disk_access(root: &Path, report: Option<&StatusReport>) -> Check {
    let applies = cfg!(target_os = "macos") && root == Path::new("/");
    full_disk_access_from(applies, report)
}

/// Judges the daemon's report (`applies`: this is the Mac the daemon runs on).
#[must_use]
pub fn full_disk_access_from(applies: bool, report: Option<&StatusReport>) -> Check {
    const NAME: &str = "disk access";
    if !applies {
        return Check::new(NAME, Status::NotApplicable, "Full Disk Access: macOS only");
    }
    match report.map(|r| r.full_disk_access) {
        None => Check::new(
            NAME,
            Status::NotApplicable,
            "metaliftd is not answering: cannot ask whether it has Full Disk Access",
        ),
        Some(Some(true)) => Check::new(
            NAME,
            Status::Ok,
            "metaliftd has Full Disk Access: it can read executables in protected folders",
        ),
        Some(Some(false)) => Check::new(
            NAME,
            Status::Warn,
            "metaliftd has no Full Disk Access: executables under ~/Desktop, ~/Documents, ~/Downloads and on removable or network volumes are decided without their signature or hash (audit: identity unreadable: permission denied)",
        )
        .fix(GRANT),
        Some(None) => Check::new(
            NAME,
            Status::Warn,
            "metaliftd did not say whether it has Full Disk Access (an older daemon, or its probe of the TCC database told nothing)",
        )
        .fix(GRANT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(full_disk_access: Option<bool>) -> StatusReport {
        let mut r: StatusReport = serde_json::from_value(serde_json::json!({
            "version": "0.1.0", "pid": 1, "started_at": "t", "policy_path": "/etc/metalift/policy.toml",
            "policy_sha256": "ab", "policy_loaded_at": "t", "rule_count": 2, "mode": "enforce",
            "last_reload_error": null, "check_ins": 0, "unlocks": 0, "would_unlock": 0,
            "outcomes": 0, "audit_failures": 0, "cache_entries": 0
        }))
        .expect("a report");
        r.full_disk_access = full_disk_access;
        r
    }

    #[test]
    fn given_a_daemon_without_full_disk_access_then_doctor_warns_and_says_how_to_grant_it() {
        let c = full_disk_access_from(true, Some(&report(Some(false))));
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("identity unreadable: permission denied"));
        assert!(
            c.fix.contains("PPPC profile")
                && c.fix.contains("Privacy & Security > Full Disk Access")
        );
        assert!(c.fix.contains("/usr/local/metalift/bin/metaliftd"));
    }

    #[test]
    fn given_access_or_no_mac_then_nothing_to_fix() {
        assert_eq!(
            full_disk_access_from(true, Some(&report(Some(true)))).status,
            Status::Ok
        );
        assert_eq!(
            full_disk_access_from(false, Some(&report(Some(false)))).status,
            Status::NotApplicable
        );
        assert_eq!(
            full_disk_access_from(true, None).status,
            Status::NotApplicable
        );
        assert_eq!(
            full_disk_access_from(true, Some(&report(None))).status,
            Status::Warn
        );
    }
}
