//! `metalift exec --require-unlock`: runs the command as a child, then learns from
//! the daemon's audit log (never from the program) whether some process of the
//! command's tree got an `unlock` verdict and the shim's outcome `applied`; exit 4
//! when not, or when that cannot be learned, so a CI job fails loudly instead of
//! running on Apple5.
//!
//! The command's whole process tree counts: `sh -c`, `make`, a Python launcher
//! whose child is the Metal program. A decision belongs to the tree when its pid is
//! the command's, or the command's pid is among the ancestors the daemon recorded
//! when that process checked in (`DecisionRecord::ancestors`, read from the kernel
//! by the daemon, never from the program). Only records written after the log was
//! opened (it is opened at its end before the child starts) and no later than the
//! command's exit count: the command's pid cannot be reused before this process
//! reaps it, so a recycled pid cannot match. A descendant that outlives the command
//! does not count.
//!
//! Exit status: the command's own when it failed (with a line saying so; 128 +
//! the signal when it was killed), whatever the unlock; 4 only when it ran fine
//! but was not unlocked; otherwise the command's 0.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant, SystemTime};

use metalift_daemon::audit::reader::{Entry, Item, LogReader};
use metalift_daemon::audit::{DecisionRecord, OutcomeRecord, Record};
use metalift_policy::FamilyExpectation;

use super::{daemon_health, exec_failure, NOT_UNLOCKED};

/// How long to wait after the child exits for the daemon's outcome records to appear.
const GRACE: Duration = Duration::from_secs(3);

/// What `--require-unlock` checks, and where it looks.
#[derive(Debug, Clone)]
pub struct Requirement {
    /// The audit log the decisions are read from.
    pub log: PathBuf,
    /// The daemon's socket, asked for its health when the unlock did not happen.
    pub socket: Option<PathBuf>,
    /// How to ask it.
    pub daemon: crate::daemon_args::DaemonArgs,
    /// `--expect-family`: what the unlocked process must answer besides `applied`.
    pub expect: Option<FamilyExpectation>,
    /// `--quiet`: say only what explains a non-zero exit status.
    pub quiet: bool,
}

/// Runs `command` (already injected) and checks its tree's unlock.
pub fn run(mut command: Command, program: &Path, req: &Requirement) -> anyhow::Result<ExitCode> {
    let reader = LogReader::open_tail(&req.log, 0, &mut |_| false);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => return Ok(exec_failure(program, &err)),
    };
    let root = child.id();
    let status = child.wait()?;
    let ended = SystemTime::now();
    if let Some(code) = own_failure(program, status) {
        return Ok(code);
    }
    let tree = match reader {
        Ok(mut reader) => learn(&mut reader, root, ended).map_err(|e| read_problem(&req.log, &e)),
        Err(e) => Err(read_problem(&req.log, &e)),
    };
    match tree.and_then(|tree| judge(root, &req.log, &tree, req.expect)) {
        Ok(unlocked) => {
            if !req.quiet {
                eprintln!("metalift: {unlocked}");
                // Unlocked, and the daemon's state as every tool judges it when it
                // is not healthy (the last good policy unlocked, say): a note.
                if let Some(socket) = &req.socket {
                    for finding in &crate::judgement::ask(&req.daemon, socket).findings {
                        eprintln!("metalift: note: {}", daemon_health::describe(finding));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(reason) => {
            eprintln!("metalift: --require-unlock: {reason}");
            // The daemon's state as every tool judges it: its causes, and the
            // ladder's status when it is worse than "this one process got none".
            let mut code = NOT_UNLOCKED;
            if let Some(socket) = &req.socket {
                let judged = crate::judgement::ask(&req.daemon, socket);
                for finding in &judged.findings {
                    eprintln!(
                        "metalift: --require-unlock: {}",
                        daemon_health::describe(finding)
                    );
                }
                code = code.max(judged.exit_code());
            }
            Ok(ExitCode::from(code))
        }
    }
}

/// The command's own failure, said and passed through: its exit status, or 128 +
/// the signal that killed it. `None` when it exited 0.
fn own_failure(program: &Path, status: ExitStatus) -> Option<ExitCode> {
    let shown = program.display();
    match (status.code(), status.signal()) {
        (Some(0), _) => None,
        (Some(code), _) => {
            eprintln!(
                "metalift: {shown} exited with status {code}: passing it through (--require-unlock judges only a command that succeeds)"
            );
            Some(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
        (None, Some(signal)) => {
            let code = 128 + signal;
            eprintln!(
                "metalift: {shown} was killed by signal {signal}{}: exiting {code} (--require-unlock judges only a command that succeeds)",
                signal_name(signal).map_or(String::new(), |n| format!(" ({n})"))
            );
            Some(ExitCode::from(u8::try_from(code).unwrap_or(255)))
        }
        (None, None) => {
            eprintln!("metalift: {shown} ended without an exit status");
            Some(ExitCode::from(1))
        }
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
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

/// The decisions of a command's process tree, in log order, and their outcomes.
#[derive(Debug, Default)]
struct Tree {
    decisions: Vec<DecisionRecord>,
    outcomes: HashMap<u64, OutcomeRecord>,
}

impl Tree {
    /// Whether `d` is a decision for the command (`root`) or one of its descendants.
    fn holds(root: u32, d: &DecisionRecord) -> bool {
        u32::try_from(d.pid).is_ok_and(|pid| pid == root) || d.ancestors.contains(&root)
    }

    /// Whether every unlock decision has its outcome: nothing more to wait for.
    fn complete(&self) -> bool {
        self.decisions
            .iter()
            .filter(|d| d.action == "unlock")
            .all(|d| self.outcomes.contains_key(&d.decision_id))
    }
}

/// Reads what was appended until every unlock decision of the tree has its outcome,
/// or the grace period ends.
fn learn(reader: &mut LogReader, root: u32, ended: SystemTime) -> io::Result<Tree> {
    let deadline = Instant::now() + GRACE;
    let mut tree = Tree::default();
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
                Record::Decision(d) if d.time <= ended && Tree::holds(root, &d) => {
                    tree.decisions.push(d);
                }
                Record::Outcome(o)
                    if tree
                        .decisions
                        .iter()
                        .any(|d| d.decision_id == o.decision_id) =>
                {
                    tree.outcomes.insert(o.decision_id, o);
                }
                _ => {}
            }
            Ok(())
        })?;
        let found = !tree.decisions.is_empty();
        if (found && tree.complete()) || Instant::now() >= deadline {
            return Ok(tree);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One line about the process that was unlocked when some process of the tree was
/// (unlock, `applied`, and the answers `expect` asks); otherwise why none was.
fn judge(
    root: u32,
    log: &Path,
    tree: &Tree,
    expect: Option<FamilyExpectation>,
) -> Result<String, String> {
    if tree.decisions.is_empty() {
        return Err(format!(
            "no decision for pid {root} or any process it started in {} (no daemon \
             answered, the shim was not loaded, or no process of the command loaded Metal)",
            log.display()
        ));
    }
    let mut reasons = Vec::new();
    for d in &tree.decisions {
        match why_not(d, tree.outcomes.get(&d.decision_id), expect) {
            Ok(applied) => return Ok(applied),
            Err(reason) => reasons.push(reason),
        }
    }
    // The most useful reason first: a process that was unlocked and then fell short.
    reasons.sort_by_key(|(rank, _)| std::cmp::Reverse(*rank));
    let shown: Vec<String> = reasons.iter().take(3).map(|(_, r)| r.clone()).collect();
    let more = reasons.len().saturating_sub(shown.len());
    Err(format!(
        "{}{}",
        shown.join("; "),
        if more > 0 {
            format!(" (and {more} more decisions)")
        } else {
            String::new()
        }
    ))
}

/// How far a decision got (higher is closer to an unlock) and why it is not one.
type Reason = (u8, String);

/// `Ok(line)` when `d` was unlocked, applied, and answers as expected; else why not.
fn why_not(
    d: &DecisionRecord,
    outcome: Option<&OutcomeRecord>,
    expect: Option<FamilyExpectation>,
) -> Result<String, Reason> {
    let who = format!("decision {} for pid {} ({})", d.decision_id, d.pid, d.exe);
    let rule = d.rule.clone().unwrap_or_else(|| "(none)".to_owned());
    if d.action != "unlock" {
        return Err(if d.would_unlock {
            (
                1,
                format!(
                    "{who}: rule {rule} would unlock, but the policy is in monitor mode (stock)"
                ),
            )
        } else if let Some(why) = &d.unverified {
            (
                1,
                format!(
                    "{who}: rule {rule} unlocks, but its profile requires verification: {why} (stock)"
                ),
            )
        } else {
            (0, format!("{who}: stock, rule {rule}"))
        });
    }
    let Some(o) = outcome else {
        return Err((
            2,
            format!(
                "{who} was unlock (rule {rule}), but the shim reported no outcome (the program \
                 never created a Metal device?)"
            ),
        ));
    };
    if o.result != "applied" {
        let reason = if o.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", o.reason)
        };
        return Err((
            3,
            format!(
                "{who} was unlock (rule {rule}), but the shim's outcome was {}{reason}",
                o.result
            ),
        ));
    }
    let answers = |n: u8| {
        o.effective
            .families
            .iter()
            .any(|f| *f == format!("Apple{n}"))
    };
    let highest = (1..=10u8).rev().find(|n| answers(*n));
    let family = highest.map_or("no Apple family".to_owned(), |n| format!("Apple{n}"));
    if let Some(expected) = expect {
        if !expected.holds(answers) {
            return Err((
                4,
                format!(
                    "{who} was unlocked by rule {rule} and applied, but answers up to {family}, \
                     not {expected} (--expect-family)"
                ),
            ));
        }
    }
    Ok(format!(
        "pid {} ({}) unlocked by rule {rule}: the shim applied the profile (up to {family})",
        d.pid, d.exe
    ))
}

#[cfg(test)]
mod tests {
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
            ancestors: Vec::new(),
            rule: Some("r".into()),
            action: action.into(),
            profile: None,
            mode: "enforce".into(),
            apple_family_max: None,
            apple_family_requested: None,
            apple_family_capped: None,
            unverified: None,
            window: None,
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
                ..Default::default()
            },
        )
    }

    fn tree(d: DecisionRecord, o: Option<OutcomeRecord>) -> Tree {
        Tree {
            outcomes: o.into_iter().map(|o| (o.decision_id, o)).collect(),
            decisions: vec![d],
        }
    }

    #[test]
    fn only_unlock_with_an_applied_outcome_passes() {
        let log = Path::new("audit.jsonl");
        let judge = |d, o| judge(42, log, &tree(d, o), None);
        assert!(judge(
            decision("unlock", false),
            Some(outcome(OutcomeResult::Applied, ""))
        )
        .is_ok_and(|line| line.contains("unlocked by rule r")));
        let failed = judge(
            decision("unlock", false),
            Some(outcome(OutcomeResult::Failed, "selector missing")),
        )
        .unwrap_err();
        assert!(failed.contains("failed: selector missing"), "{failed}");
        // A stock verdict fails even if something claims "applied".
        assert!(judge(
            decision("stock", false),
            Some(outcome(OutcomeResult::Applied, ""))
        )
        .is_err());
        let monitor = judge(decision("stock", true), None).unwrap_err();
        assert!(monitor.contains("monitor mode"), "{monitor}");
        let mut unverified = decision("stock", false);
        unverified.unverified = Some("none recorded for host chip Apple M2".into());
        let unverified = judge(unverified, None).unwrap_err();
        assert!(
            unverified.contains("requires verification: none recorded for host chip Apple M2"),
            "{unverified}"
        );
        assert!(judge(decision("unlock", false), None)
            .unwrap_err()
            .contains("no outcome"));
        let empty = super::judge(42, log, &Tree::default(), None).unwrap_err();
        assert!(empty.contains("no decision"), "{empty}");
    }

    #[test]
    fn a_descendant_counts_by_its_recorded_ancestors() {
        let mut child = decision("unlock", false);
        child.pid = 99;
        assert!(!Tree::holds(42, &child));
        child.ancestors = vec![98, 42, 7];
        assert!(Tree::holds(42, &child));
        assert!(Tree::holds(42, &decision("stock", false)));
    }
}
