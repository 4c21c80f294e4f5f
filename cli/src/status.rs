//! `metalift status`: what the running daemon serves, whether the file on disk is
//! what it serves, and every problem, cause first.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::daemon_args::DaemonArgs;
use crate::doctor::marker;
#[cfg(test)]
use crate::judgement::read_disk;
use crate::judgement::{self, Disk, Level};
#[cfg(test)]
use metalift_policy::DEFAULT_MAX_POLICY_BYTES;

use metalift_daemon::service::health::code;
use metalift_daemon::service::status::StatusReport;

/// The daemon answers and serves the file on disk.
pub const EXIT_HEALTHY: u8 = judgement::EXIT_HEALTHY;
/// The daemon answers, but the file on disk is refused or differs from the live
/// policy (the last good one unlocks).
pub const EXIT_DISK_NOT_LIVE: u8 = judgement::EXIT_DISK_NOT_LIVE;
/// The daemon answers but is degraded: it unlocks, but not all its policy says
/// (policy.toml missing, a profile unverified, its health unknown).
pub const EXIT_DEGRADED: u8 = judgement::EXIT_DEGRADED;
/// It unlocks nothing: no daemon answers, no policy has been live since it
/// started, or its audit log cannot take records.
pub const EXIT_UNLOCKS_NOTHING: u8 = judgement::EXIT_UNLOCKS_NOTHING;
/// No daemon answers on the socket: it unlocks nothing.
pub const EXIT_UNREACHABLE: u8 = EXIT_UNLOCKS_NOTHING;

/// Arguments of `metalift status`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit status:\n  \
    0  healthy: the daemon answers and its live policy is the file on disk\n  \
    3  the daemon answers, but it refused the file on disk or has not loaded it\n     \
       (the live policy is the last good one and unlocks; `kill -HUP` or\n     \
       `sudo launchctl kill HUP system/com.metalift.metaliftd` reloads)\n  \
    4  degraded: it unlocks, but not all its policy says, the cause printed\n     \
       first: policy.toml is missing (the last good policy stays live), a\n     \
       require_verified profile is unverified or the verification file refused,\n     \
       or the daemon reports no health (unknown, never healthy)\n  \
    5  it unlocks nothing, the cause printed first: no daemon answers on the\n     \
       socket (or not in time), no policy has been live since it started, or\n     \
       the audit log cannot take records (every decision is stock)\n\n\
    One ladder for every tool: a worse state never exits milder.\n\n\
    With --json the same facts are printed as one JSON object on stdout in every\n\
    case: \"ok\" (bool), \"state\" (healthy, disk_not_live, degraded,\n\
    unlocks_nothing, unreachable), \"cause\" ({\"code\", \"message\", \"level\"} or null),\n\
    \"error\" (string or null), \"problems\" (list, cause first), \"socket\",\n\
    \"disk_sha256\", and, when the daemon answered, its report's fields (among\n\
    them \"health\": {\"state\": \"ok\"|\"degraded\", \"causes\": [{\"code\", \"message\"}]}).")]
pub struct Args {
    // Where the daemon is.
    #[command(flatten)]
    pub daemon: DaemonArgs,
    /// Print one JSON object (also when the daemon is down) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Wait up to SECS for a daemon to answer on the socket before judging (for a
    /// script that has just started one: a socket not there yet, or one left by an
    /// earlier daemon, is asked again); the exit status is then the state's.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub wait: u64,
}

/// What `metalift status --json` prints: one stable shape whatever happened.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    /// True when the exit status is 0.
    pub ok: bool,
    /// `healthy`, `disk_not_live`, `degraded`, `unlocks_nothing` (exit 0, 3, 4,
    /// 5), or `unreachable` (exit 5: no daemon answers).
    pub state: &'static str,
    /// The cause to fix first, as every tool names it (`null` when healthy).
    pub cause: Option<judgement::Finding>,
    /// Why the daemon could not be asked; `null` when it answered.
    pub error: Option<String>,
    /// Every problem, cause first; empty when healthy.
    pub problems: Vec<String>,
    /// The socket asked.
    pub socket: String,
    /// The policy hash of the file on disk (same function as the daemon's), when
    /// it could be read.
    pub disk_sha256: Option<String>,
    /// This user's unresponsive marker for the socket, when one is in force
    /// (the shim probes or skips the daemon: `doctor/marker.rs`).
    pub unresponsive_marker: Option<String>,
    /// The daemon's report, its fields at the top level; absent when unreachable.
    #[serde(flatten)]
    pub daemon: Option<StatusReport>,
}

/// Runs `metalift status` (exit codes: see [`Args`]'s help).
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let socket = args.daemon.socket()?;
    let (code, out) = examine_waiting(&args.daemon, &socket, Duration::from_secs(args.wait));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if let Some(marker) = &out.unresponsive_marker {
            println!("shim marker: {marker}");
        }
        match &out.daemon {
            Some(report) => {
                // The cause first, before the figures: the judgement every tool
                // prints (its level's word, then the cause).
                if let Some(cause) = &out.cause {
                    println!(
                        "{}: {} ({})",
                        level_heading(cause.level),
                        cause.message,
                        cause.code
                    );
                }
                print!("{}", report.to_text());
                if let Some(sha) = &out.disk_sha256 {
                    println!("file on disk      sha256 {sha}");
                }
                if !out.problems.is_empty() {
                    println!("problems (cause first):");
                    for (i, p) in out.problems.iter().enumerate() {
                        let mut lines = p.lines();
                        println!("  {}. {}", i + 1, lines.next().unwrap_or_default());
                        for l in lines {
                            println!("     {l}");
                        }
                    }
                }
            }
            None => match &out.cause {
                // The judgement's words, as every tool says them.
                Some(cause) => eprintln!(
                    "metalift: {}: {} ({})",
                    level_heading(cause.level),
                    cause.message,
                    cause.code
                ),
                None => {
                    if let Some(error) = &out.error {
                        eprintln!("metalift: {error}");
                    }
                }
            },
        }
    }
    Ok(ExitCode::from(code))
}

/// The first line's heading for a cause at `level`.
fn level_heading(level: Level) -> &'static str {
    match level {
        Level::Healthy => "OK",
        Level::DiskNotLive => "NOT THE FILE ON DISK",
        Level::Degraded => "DEGRADED",
        Level::UnlocksNothing => "UNLOCKS NOTHING",
    }
}

/// How often `--wait` asks again while no daemon answers.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// [`examine`], asked again every [`WAIT_POLL`] while no daemon answers, until one
/// does or `wait` has passed (`wait` zero: asked once).
#[must_use]
pub fn examine_waiting(daemon: &DaemonArgs, socket: &Path, wait: Duration) -> (u8, StatusJson) {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let (code, out) = examine_with(daemon, socket);
        if out.daemon.is_some() || std::time::Instant::now() >= deadline {
            return (code, out);
        }
        std::thread::sleep(WAIT_POLL);
    }
}

/// Asks the daemon, compares with the disk, and returns the exit code and the report.
#[must_use]
pub fn examine(socket: &Path) -> (u8, StatusJson) {
    examine_with(&DaemonArgs::default(), socket)
}

/// [`examine`], asking as `daemon` says (its timeout).
#[must_use]
pub fn examine_with(daemon: &DaemonArgs, socket: &Path) -> (u8, StatusJson) {
    let judged = crate::judgement::ask(daemon, socket);
    let code = judged.exit_code();
    let cause = judged.cause().cloned();
    let (Some(report), Some(disk)) = (judged.report, judged.disk) else {
        let error = judged.error.unwrap_or_default();
        return (
            code,
            StatusJson {
                ok: false,
                state: "unreachable",
                cause,
                problems: vec![error.clone()],
                error: Some(error),
                socket: socket.display().to_string(),
                disk_sha256: None,
                unresponsive_marker: marker::for_this_user(socket).in_force(),
                daemon: None,
            },
        );
    };
    let problems = problems(&report, &disk);
    let disk_sha256 = match &disk {
        Disk::Hashed(sha) => Some(sha.clone()),
        Disk::Missing | Disk::TooLarge { .. } | Disk::Unreadable(_) => None,
    };
    (
        code,
        StatusJson {
            ok: code == EXIT_HEALTHY,
            state: judged.level.word(),
            cause,
            error: None,
            problems: problems.into_iter().map(|p| p.text).collect(),
            socket: socket.display().to_string(),
            disk_sha256,
            unresponsive_marker: marker::for_this_user(socket).in_force(),
            daemon: Some(report),
        },
    )
}

struct Problem {
    text: String,
    /// Whether it is a problem of the daemon's state (a note about this CLI's
    /// view is not); the judgement decides the exit status, the tests check both agree.
    #[cfg_attr(not(test), allow(dead_code))]
    counts: bool,
}

/// The problems, cause first: the daemon's refusal (every diagnostic), then what
/// follows from it (the live policy is not the file); or, with no refusal, a
/// file the daemon has not loaded yet.
fn problems(report: &StatusReport, disk: &Disk) -> Vec<Problem> {
    let mut out = Vec::new();
    // What the daemon itself reports first: an audit log that cannot take records
    // turns every unlock off, whatever the policy says. A missing policy.toml is
    // said here too (once: its refusal below is the same fact); a refused one is
    // detailed below, every error listed.
    let missing = report
        .health
        .causes
        .iter()
        .any(|c| c.code == code::POLICY_MISSING);
    for cause in &report.health.causes {
        if cause.code != code::POLICY_REJECTED {
            out.push(Problem {
                text: format!("{} ({})", cause.message, cause.code),
                counts: true,
            });
        }
    }
    if missing {
        return out;
    }
    let errors: Vec<String> = if report.last_reload_errors.is_empty() {
        report
            .last_reload_error
            .iter()
            .flat_map(|e| e.lines().map(str::to_owned))
            .collect()
    } else {
        report.last_reload_errors.clone()
    };
    if !errors.is_empty() {
        let sha = report
            .refused_sha256
            .as_deref()
            .map(|s| format!(" (sha256 {s})"))
            .unwrap_or_default();
        let count = errors.len();
        let mut text = format!(
            "the daemon refused {}{sha}: {count} error{}",
            report.policy_path,
            if count == 1 { "" } else { "s" }
        );
        for e in &errors {
            text.push('\n');
            text.push_str(e);
        }
        out.push(Problem { text, counts: true });
        out.push(Problem {
            text: format!(
                "so the live policy is the last good one: sha256 {} ({} rules, loaded at {})",
                report.policy_sha256, report.rule_count, report.policy_loaded_at
            ),
            counts: true,
        });
        return out;
    }
    match disk {
        Disk::Hashed(sha) if *sha != report.policy_sha256 => {
            out.push(Problem {
                text: format!(
                    "the file on disk (sha256 {sha}) is not the live policy (sha256 {}): \
                     the daemon has not loaded it yet (SIGHUP reloads; `metalift validate` \
                     checks it)",
                    report.policy_sha256,
                ),
                counts: true,
            });
        }
        Disk::Missing => out.push(Problem {
            text: format!(
                "{} does not exist: the live policy (sha256 {}, {} rules) is on no disk; \
                 the daemon keeps it until a policy is installed",
                report.policy_path, report.policy_sha256, report.rule_count
            ),
            counts: true,
        }),
        Disk::TooLarge { bytes, limit } => out.push(Problem {
            text: format!(
                "the policy on disk is {bytes} bytes (policy.toml and policy.d/ together), \
                 over the daemon's {limit}-byte limit: it will be refused unread"
            ),
            counts: true,
        }),
        Disk::Unreadable(why) => out.push(Problem {
            text: format!("cannot compare with the file on disk from here: {why}"),
            counts: false,
        }),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sha: &str) -> StatusReport {
        serde_json::from_value(serde_json::json!({
            "version": "0.1.0", "pid": 1, "started_at": "t", "policy_path": "/etc/metalift/policy.toml",
            "policy_sha256": sha, "policy_loaded_at": "t", "rule_count": 2, "mode": "enforce",
            "last_reload_error": null, "check_ins": 0, "unlocks": 0, "would_unlock": 0,
            "outcomes": 0, "audit_failures": 0, "cache_entries": 0,
            "health": {"state": "ok", "causes": []}
        }))
        .expect("a report")
    }

    #[test]
    fn a_file_on_disk_the_daemon_has_not_loaded_is_a_problem_that_counts() {
        let live = "a".repeat(64);
        let found = problems(&report(&live), &Disk::Hashed("b".repeat(64)));
        assert_eq!(found.len(), 1);
        assert!(found[0].counts);
        assert!(
            found[0].text.contains("is not the live policy"),
            "{}",
            found[0].text
        );
        assert!(problems(&report(&live), &Disk::Hashed(live.clone())).is_empty());
    }

    #[test]
    fn a_missing_policy_file_has_no_hash_and_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = read_disk(&dir.path().join("policy.toml"), DEFAULT_MAX_POLICY_BYTES);
        assert!(matches!(disk, Disk::Missing), "{disk:?}");
        let found = problems(&report(&"a".repeat(64)), &disk);
        assert_eq!(found.len(), 1);
        assert!(found[0].counts);
        assert!(
            found[0].text.contains("does not exist"),
            "{}",
            found[0].text
        );
    }

    #[test]
    fn a_file_this_user_cannot_read_is_noted_but_does_not_fail_the_status() {
        let found = problems(&report("a"), &Disk::Unreadable("permission denied".into()));
        assert_eq!(found.len(), 1);
        assert!(!found[0].counts);
    }
}
