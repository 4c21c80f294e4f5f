//! `metalift status`: what the running daemon serves, whether the file on disk is
//! what it serves, and every problem, cause first.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use metalift_policy::{load, sources_sha256, LoadError, LoadOptions, Policy};
use serde::Serialize;

use metalift_daemon::service::status::{self, StatusReport};

/// How long to wait for the daemon's answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The daemon answers and serves the file on disk.
pub const EXIT_HEALTHY: u8 = 0;
/// No daemon answers on the socket (or its answer is unreadable).
pub const EXIT_UNREACHABLE: u8 = 1;
/// The daemon answers, but the file on disk is refused or differs from the live policy.
pub const EXIT_DISK_NOT_LIVE: u8 = 3;

/// Arguments of `metalift status`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit status:\n  \
    0  healthy: the daemon answers and its live policy is the file on disk\n  \
    1  no daemon answers on the socket\n  \
    3  the daemon answers, but it refused the file on disk or has not loaded it\n     \
       (the live policy is the last good one; `kill -HUP` or\n     \
       `sudo launchctl kill HUP system/com.metalift.metaliftd` reloads)\n\n\
    With --json the same facts are printed as one JSON object on stdout in every\n\
    case: \"ok\" (bool), \"error\" (string or null), \"problems\" (list, cause first),\n\
    \"socket\", \"disk_sha256\", and, when the daemon answered, its report's fields.")]
pub struct Args {
    /// The daemon's socket [default: the system daemon's socket when it exists
    /// (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS),
    /// else the user's ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in
    /// the user's own DARWIN_USER_TEMP_DIR)].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print one JSON object (also when the daemon is down) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `metalift status --json` prints: one stable shape whatever happened.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    /// True when the exit status is 0.
    pub ok: bool,
    /// Why the daemon could not be asked; `null` when it answered.
    pub error: Option<String>,
    /// Every problem, cause first; empty when healthy.
    pub problems: Vec<String>,
    /// The socket asked.
    pub socket: String,
    /// The policy hash of the file on disk (same function as the daemon's), when
    /// it could be read.
    pub disk_sha256: Option<String>,
    /// The daemon's report, its fields at the top level; absent when unreachable.
    #[serde(flatten)]
    pub daemon: Option<StatusReport>,
}

/// The file on disk, as this process can see it.
#[derive(Debug)]
enum Disk {
    /// Loaded (or absent: the empty policy), with its hash.
    Hashed(String),
    /// Refused by validation, with its hash.
    Refused(String),
    /// Could not be read here (e.g. not readable by this user).
    Unreadable(String),
}

/// Runs `metalift status` (exit codes: see [`Args`]'s help).
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let socket = match args.socket {
        Some(s) => s,
        None => metalift_daemon::service::config::default_client_socket()?,
    };
    let (code, out) = examine(&socket);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        match &out.daemon {
            Some(report) => {
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
            None => {
                if let Some(error) = &out.error {
                    eprintln!("metalift: {error}");
                }
            }
        }
    }
    Ok(ExitCode::from(code))
}

/// Asks the daemon, compares with the disk, and returns the exit code and the report.
#[must_use]
pub fn examine(socket: &Path) -> (u8, StatusJson) {
    let report = match status::request(socket, TIMEOUT) {
        Ok(report) => report,
        Err(err) => {
            let error = err.to_string();
            return (
                EXIT_UNREACHABLE,
                StatusJson {
                    ok: false,
                    problems: vec![error.clone()],
                    error: Some(error),
                    socket: socket.display().to_string(),
                    disk_sha256: None,
                    daemon: None,
                },
            );
        }
    };
    let disk = read_disk(Path::new(&report.policy_path));
    let problems = problems(&report, &disk);
    let disk_sha256 = match &disk {
        Disk::Hashed(sha) | Disk::Refused(sha) => Some(sha.clone()),
        Disk::Unreadable(_) => None,
    };
    let code = if problems.iter().any(|p| p.counts) {
        EXIT_DISK_NOT_LIVE
    } else {
        EXIT_HEALTHY
    };
    (
        code,
        StatusJson {
            ok: code == EXIT_HEALTHY,
            error: None,
            problems: problems.into_iter().map(|p| p.text).collect(),
            socket: socket.display().to_string(),
            disk_sha256,
            daemon: Some(report),
        },
    )
}

/// Hashes the policy on disk with the policy crate's function (the daemon's).
/// Ownership is not checked here: the daemon's own refusal says so if it matters.
fn read_disk(policy: &Path) -> Disk {
    let opts = LoadOptions {
        allow_insecure_owner: true,
    };
    match load(policy, &opts) {
        Ok(loaded) => Disk::Hashed(loaded.policy.sha256_hex().to_owned()),
        Err(LoadError::NotFound { .. }) => Disk::Hashed(Policy::empty().sha256_hex().to_owned()),
        Err(LoadError::Invalid { sources, .. }) => Disk::Refused(sources_sha256(&sources)),
        Err(other) => Disk::Unreadable(other.to_string()),
    }
}

struct Problem {
    text: String,
    /// Whether it makes the exit status 3 (a note about this CLI's view does not).
    counts: bool,
}

/// The problems, cause first: the daemon's refusal (every diagnostic), then what
/// follows from it (the live policy is not the file); or, with no refusal, a
/// file the daemon has not loaded yet.
fn problems(report: &StatusReport, disk: &Disk) -> Vec<Problem> {
    let mut out = Vec::new();
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
        Disk::Hashed(sha) | Disk::Refused(sha) if *sha != report.policy_sha256 => {
            out.push(Problem {
                text: format!(
                    "the file on disk (sha256 {sha}) is not the live policy (sha256 {}): \
                     the daemon has not loaded it yet{}",
                    report.policy_sha256,
                    if matches!(disk, Disk::Refused(_)) {
                        ", and it has errors (`metalift validate` lists them)"
                    } else {
                        " (SIGHUP reloads)"
                    }
                ),
                counts: true,
            });
        }
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
            "outcomes": 0, "audit_failures": 0, "cache_entries": 0
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
    fn a_file_this_user_cannot_read_is_noted_but_does_not_fail_the_status() {
        let found = problems(&report("a"), &Disk::Unreadable("permission denied".into()));
        assert_eq!(found.len(), 1);
        assert!(!found[0].counts);
    }
}
