//! Why the daemon could not unlock, as every tool judges it ([`crate::judgement`]):
//! for `metalift exec` to name the cause (a full audit disk, no policy live, an
//! unverified profile) and to exit with the ladder's status, instead of leaving
//! the admin to guess.

use crate::judgement::{Finding, Level};

/// One finding as `exec` says it: "cannot unlock" only for a cause that turns
/// every unlock off; otherwise the level it puts the daemon at.
#[must_use]
pub fn describe(finding: &Finding) -> String {
    let what = if finding.level == Level::UnlocksNothing {
        "the daemon cannot unlock"
    } else {
        "the daemon reports"
    };
    format!(
        "{what} ({}): {}: {}",
        finding.level.word(),
        finding.code,
        finding.message
    )
}

#[cfg(test)]
mod tests {
    use super::describe;
    use crate::judgement::{level_of, Finding};
    use metalift_daemon::service::health::{code, Cause};

    fn finding(code: &str, message: &str) -> Finding {
        Finding {
            code: code.into(),
            message: message.into(),
            level: level_of(&Cause::new(code, message.into())),
        }
    }

    #[test]
    fn only_a_cause_that_turns_unlocks_off_is_said_to_stop_them() {
        assert_eq!(
            describe(&finding(code::AUDIT_WRITE_FAILED, "the last audit write failed")),
            "the daemon cannot unlock (unlocks_nothing): audit_write_failed: the last audit write failed"
        );
        assert_eq!(
            describe(&finding(
                code::POLICY_REJECTED,
                "the last policy load was refused"
            )),
            "the daemon reports (disk_not_live): policy_rejected: the last policy load was refused"
        );
    }
}
