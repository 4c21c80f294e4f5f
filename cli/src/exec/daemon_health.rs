//! Why the daemon could not unlock, as it reports it: the `health` of its status
//! ([`metalift_daemon::service::health`]), for `metalift exec` to name the cause
//! (a full audit disk, a missing policy) instead of leaving the admin to guess.
//!
//! Daemons older than that field send no `health`: then nothing is said.

use std::path::Path;
use std::time::Duration;

use metalift_daemon::service::health::Cause;

/// How long to wait for the daemon's status: it answers from memory.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The causes of a degraded daemon on `socket`, one line each ([`describe`]);
/// empty when it is healthy, reports no health, or does not answer (that is said
/// before the command runs).
pub fn degraded_causes(socket: &Path) -> Vec<String> {
    metalift_daemon::service::status::request(socket, TIMEOUT)
        .map(|report| report.health.causes.iter().map(describe).collect())
        .unwrap_or_default()
}

/// One cause as `exec` says it: "cannot unlock" only for a cause that turns every
/// unlock off; a refused or missing policy leaves the last good one unlocking.
pub fn describe(cause: &Cause) -> String {
    let what = if cause.stops_unlocks() {
        "the daemon cannot unlock"
    } else {
        "the daemon reports"
    };
    format!("{what}: {}: {}", cause.code, cause.message)
}

#[cfg(test)]
mod tests {
    use super::describe;
    use metalift_daemon::service::health::{code, Cause};

    #[test]
    fn only_a_cause_that_turns_unlocks_off_is_said_to_stop_them() {
        let full = Cause {
            code: code::AUDIT_WRITE_FAILED.into(),
            message: "the last audit write failed".into(),
        };
        assert_eq!(
            describe(&full),
            "the daemon cannot unlock: audit_write_failed: the last audit write failed"
        );
        let rejected = Cause {
            code: code::POLICY_REJECTED.into(),
            message: "the last policy load was refused".into(),
        };
        assert_eq!(
            describe(&rejected),
            "the daemon reports: policy_rejected: the last policy load was refused"
        );
    }
}
