//! What the daemon itself experiences, as `metalift doctor` checks it: the health it
//! reports (its last audit write, the free space where it writes, a missing or
//! refused policy), and the free space doctor measures on the audit log it was
//! pointed at. A file that only *looks* writable from here is not proof: a full
//! disk keeps every permission bit and still refuses every record.

use std::path::Path;

use super::check::{Check, Status};
use crate::judgement::Judgement;
use metalift_daemon::service::health::{code, LOW_SPACE_BYTES};
#[cfg(test)]
use metalift_daemon::service::status::StatusReport;

/// The daemon's state as every tool judges it ([`crate::judgement`]): `fail`
/// whenever it cannot unlock as the file on disk says, naming the cause first.
pub fn daemon_health(judged: &Judgement) -> Check {
    if judged.report.is_none() {
        // The daemon check says why; here the judgement's level and the same cause.
        let cause = judged.cause_line().unwrap_or_default();
        return Check::new("health", Status::Fail, format!("unlocks_nothing: {cause}"))
            .fix("start metaliftd (the daemon check says how)");
    }
    let Some(first) = judged.cause() else {
        return Check::new(
            "health",
            Status::Ok,
            "metaliftd reports no cause that keeps it from unlocking",
        );
    };
    let more = match judged.findings.len() - 1 {
        0 => String::new(),
        1 => " (and 1 more cause: `metalift status` lists it)".to_owned(),
        n => format!(" (and {n} more causes: `metalift status` lists them)"),
    };
    let message = format!(
        "{}: {} ({}){more}",
        judged.level.word(),
        first.message,
        first.code
    );
    let pid = judged.report.as_ref().map(|r| r.pid);
    let reload = pid.map_or_else(
        || {
            "fix the policy (`metalift validate` lists every error), then reload: kill -HUP \
            metaliftd's pid"
                .to_owned()
        },
        |pid| {
            format!(
                "fix the policy (`metalift validate` lists every error), then reload: \
                 sudo kill -HUP {pid} (metaliftd's pid; saving the file reloads it too)"
            )
        },
    );
    let fix = match first.code.as_str() {
        code::AUDIT_WRITE_FAILED | code::AUDIT_DISK_FULL => {
            "free space on the audit log's file system (or fix its permissions); \
             unlocks resume with the next record metaliftd can write"
        }
        code::POLICY_MISSING => {
            "put policy.toml back (sudo metalift edit); to turn unlocking off on purpose, \
             install a policy with no rules"
        }
        code::NOTHING_LIVE | code::POLICY_REJECTED => reload.as_str(),
        code::VERIFICATION_REFUSED => {
            "make the verification file root-owned, not group/other-writable, and readable; \
             or run `sudo metalift verify` again"
        }
        code::UNVERIFIED => "sudo metalift verify --profile <the profile named>",
        code::HEALTH_UNKNOWN => "upgrade metaliftd to this metalift's version",
        code::FORWARD_BEHIND => {
            "start the collector, or fix [audit.forward] address or the network to it; the \
             records wait in the local log (`metalift audit flush` waits for their delivery; \
             `metalift audit export` takes them off the guest another way)"
        }
        _ => "metalift status shows every cause",
    };
    Check::new("health", Status::Fail, message).fix(fix)
}

/// Bytes the daemon (root) could still write where `path` lives (the nearest
/// existing directory on its way), `None` when it cannot be measured.
pub fn free_bytes_at(path: &Path) -> Option<u64> {
    let dir = path.ancestors().skip(1).find(|d| d.is_dir())?;
    let vfs = rustix::fs::statvfs(dir).ok()?;
    // metaliftd runs as root: the blocks reserved for root are its to use.
    Some(vfs.f_bfree.saturating_mul(vfs.f_frsize))
}

/// `None` when `free` leaves room; else the failure doctor reports for the audit log.
pub fn low_space(path: &Path, free: Option<u64>) -> Option<Check> {
    let free = free.filter(|f| *f < LOW_SPACE_BYTES)?;
    Some(
        Check::new(
            "audit log",
            Status::Fail,
            format!(
                "{}: only {free} bytes free on its file system (under {} KiB): decisions \
                 metaliftd cannot record are answered stock",
                path.display(),
                LOW_SPACE_BYTES / 1024
            ),
        )
        .fix("free space there, or point --audit-log at a larger file system"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use metalift_daemon::service::health::{Cause, Health};

    fn report(causes: Vec<Cause>) -> StatusReport {
        let mut report: StatusReport = serde_json::from_value(serde_json::json!({
            "version": "0.1.0", "pid": 1, "started_at": "t", "policy_path": "/p",
            "policy_sha256": "a", "policy_loaded_at": "t", "rule_count": 0, "mode": "enforce",
            "last_reload_error": null, "check_ins": 0, "unlocks": 0, "would_unlock": 0,
            "outcomes": 0, "audit_failures": 0, "cache_entries": 0
        }))
        .expect("a report");
        report.health = Health::from_causes(causes);
        report
    }

    fn judged(report: StatusReport) -> Judgement {
        crate::judgement::judge(Ok(report), Path::new("/s"))
    }

    #[test]
    fn a_daemon_whose_audit_writes_fail_is_a_failure_naming_the_cause() {
        let check = daemon_health(&judged(report(vec![Cause::new(
            code::AUDIT_WRITE_FAILED,
            "the last audit write failed".into(),
        )])));
        assert_eq!(check.status, Status::Fail, "{check:?}");
        assert!(
            check
                .message
                .starts_with("unlocks_nothing: the last audit write failed"),
            "{check:?}"
        );
        assert_eq!(
            daemon_health(&judged(report(Vec::new()))).status,
            Status::Ok
        );
    }

    #[test]
    fn too_little_space_for_records_is_a_failure() {
        let path = Path::new("/var/log/metalift/audit.jsonl");
        assert!(low_space(path, Some(LOW_SPACE_BYTES)).is_none());
        assert!(low_space(path, None).is_none());
        let check = low_space(path, Some(4096)).expect("a failure");
        assert_eq!(check.status, Status::Fail);
        assert!(check.message.contains("4096 bytes free"), "{check:?}");
    }
}
