//! `metalift exec --require-unlock`: runs the command as a child, then learns from
//! the daemon's audit log (never from the program) whether its decision was
//! `unlock` and the shim's outcome `applied`; exit 4 when not, or when that
//! cannot be learned, so a CI job fails loudly instead of running on Apple5.
//!
//! The child's decision is found by its pid among the records written after the
//! log was opened (the log is opened at its end before the child starts, so a
//! recycled pid in the history cannot match). If the command `exec`s another
//! program, the last decision for the pid counts.

use std::io;
use std::path::Path;
use std::process::{Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

use super::{exec_failure, NOT_UNLOCKED};
use metalift_daemon::audit::reader::{Entry, Item, LogReader};
use metalift_daemon::audit::{DecisionRecord, OutcomeRecord, Record};

/// How long to wait after the child exits for the daemon's records to appear.
const GRACE: Duration = Duration::from_secs(3);

/// Runs `command` (already injected) and checks its unlock in `log`.
pub fn run(mut command: Command, program: &Path, log: &Path) -> anyhow::Result<ExitCode> {
    let reader = LogReader::open_tail(log, 0, &mut |_| false);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => return Ok(exec_failure(program, &err)),
    };
    let pid = i32::try_from(child.id()).unwrap_or(-1);
    let status = child.wait()?;
    let answer = match reader {
        Ok(mut reader) => learn(&mut reader, pid).map_err(|e| read_problem(log, &e)),
        Err(e) => Err(read_problem(log, &e)),
    };
    let verdict = answer.and_then(|(decision, outcome)| judge(pid, log, decision, outcome));
    match verdict {
        Ok(rule) => {
            eprintln!("metalift: pid {pid} unlocked by rule {rule}: the shim applied the profile");
            Ok(exit_code(status))
        }
        Err(reason) => {
            eprintln!("metalift: --require-unlock: {reason}");
            Ok(ExitCode::from(NOT_UNLOCKED))
        }
    }
}

fn read_problem(log: &Path, e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::PermissionDenied {
        format!(
            "cannot learn the verdict: permission denied reading the audit log {} \
             (run as root or a member of the log's group)",
            log.display()
        )
    } else {
        format!(
            "cannot learn the verdict: cannot read the audit log {}: {e}",
            log.display()
        )
    }
}

/// Reads what was appended until the pid's decision and its outcome are there,
/// or the grace period ends.
fn learn(
    reader: &mut LogReader,
    pid: i32,
) -> io::Result<(Option<DecisionRecord>, Option<OutcomeRecord>)> {
    let deadline = Instant::now() + GRACE;
    let mut decision: Option<DecisionRecord> = None;
    let mut outcome: Option<OutcomeRecord> = None;
    loop {
        reader.poll_each(&mut |item| {
            let Item::Entry(Entry {
                record: Some(record),
                ..
            }) = item
            else {
                return Ok(());
            };
            match record {
                Record::Decision(d) if d.pid == pid => {
                    outcome = None;
                    decision = Some(d);
                }
                Record::Outcome(o)
                    if decision
                        .as_ref()
                        .is_some_and(|d| d.decision_id == o.decision_id) =>
                {
                    outcome = Some(o);
                }
                _ => {}
            }
            Ok(())
        })?;
        if (decision.is_some() && outcome.is_some()) || Instant::now() >= deadline {
            return Ok((decision, outcome));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `Ok(rule)` when unlocked and applied; otherwise why not.
fn judge(
    pid: i32,
    log: &Path,
    decision: Option<DecisionRecord>,
    outcome: Option<OutcomeRecord>,
) -> Result<String, String> {
    let Some(d) = decision else {
        return Err(format!(
            "no decision for pid {pid} in {} (no daemon answered, the shim was not \
             loaded, or the program never loaded Metal)",
            log.display()
        ));
    };
    let rule = d.rule.clone().unwrap_or_else(|| "(none)".to_owned());
    if d.action != "unlock" {
        return Err(if d.would_unlock {
            format!(
                "decision {} for pid {pid}: rule {rule} would unlock, but the policy is \
                 in monitor mode (stock)",
                d.decision_id
            )
        } else {
            format!(
                "decision {} for pid {pid} ({}): stock, rule {rule}",
                d.decision_id, d.exe
            )
        });
    }
    let Some(o) = outcome else {
        return Err(format!(
            "decision {} for pid {pid} was unlock (rule {rule}), but the shim reported no \
             outcome (the program never created a Metal device?)",
            d.decision_id
        ));
    };
    if o.result != "applied" {
        return Err(format!(
            "decision {} for pid {pid} was unlock (rule {rule}), but the shim's outcome \
             was {}{}",
            d.decision_id,
            o.result,
            if o.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", o.reason)
            }
        ));
    }
    Ok(rule)
}

/// The child's status as a shell reports it: its code, or 128 + the signal.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(signal)) => ExitCode::from(u8::try_from(128 + signal).unwrap_or(255)),
        (None, None) => ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use metalift_policy::wire::{Answers, Outcome, OutcomeResult};

    use super::*;
    use metalift_daemon::audit::Advisory;

    fn decision(action: &str, would_unlock: bool) -> DecisionRecord {
        DecisionRecord {
            time: SystemTime::UNIX_EPOCH,
            decision_id: 7,
            pid: 42,
            uid: 0,
            exe: "/opt/x".into(),
            sha256: None,
            team_id: None,
            signing_id: None,
            cdhash: None,
            anchor: None,
            identity_error: None,
            parent_exe: None,
            rule: Some("r".into()),
            action: action.into(),
            profile: None,
            mode: "enforce".into(),
            apple_family_max: None,
            apple_family_requested: None,
            apple_family_capped: None,
            would_unlock,
            host_chip: None,
            policy_sha256: String::new(),
            latency_us: 0,
            transport: "unix".into(),
            advisory: Advisory::default(),
        }
    }

    fn outcome(result: OutcomeResult, reason: &str) -> OutcomeRecord {
        OutcomeRecord::new(
            SystemTime::UNIX_EPOCH,
            42,
            "/opt/x".into(),
            &Outcome {
                decision_id: 7,
                result,
                reason: reason.into(),
                device_class: "AppleParavirtDevice".into(),
                stock: Answers::default(),
                effective: Answers::default(),
            },
        )
    }

    #[test]
    fn only_unlock_with_an_applied_outcome_passes() {
        let log = Path::new("audit.jsonl");
        let judge = |d, o| judge(42, log, d, o);
        assert_eq!(
            judge(
                Some(decision("unlock", false)),
                Some(outcome(OutcomeResult::Applied, ""))
            ),
            Ok("r".to_owned())
        );
        let failed = judge(
            Some(decision("unlock", false)),
            Some(outcome(OutcomeResult::Failed, "selector missing")),
        )
        .unwrap_err();
        assert!(failed.contains("failed: selector missing"), "{failed}");
        // A stock verdict fails even if something claims "applied".
        assert!(judge(
            Some(decision("stock", false)),
            Some(outcome(OutcomeResult::Applied, ""))
        )
        .is_err());
        let monitor = judge(Some(decision("stock", true)), None).unwrap_err();
        assert!(monitor.contains("monitor mode"), "{monitor}");
        assert!(judge(Some(decision("unlock", false)), None)
            .unwrap_err()
            .contains("no outcome"));
        assert!(judge(None, None).unwrap_err().contains("no decision"));
    }
}
