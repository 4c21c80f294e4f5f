//! One judgement of the daemon's state, rendered by every tool: can it unlock
//! now, and if not why (cause first); whether the live policy is the file on
//! disk. `status`, `doctor`, `exec --require-unlock` and `explain --live` all
//! take their verdict and their exit status from [`Judgement`], so one state
//! never reads two ways.
//!
//! The exit-status ladder, mildest first ("unlocks nothing" is never milder
//! than "unlocks, degraded"):
//!
//! | level            | code | what it means                                                   |
//! |------------------|------|-----------------------------------------------------------------|
//! | `healthy`        | 0    | it unlocks as the file on disk says                             |
//! | `disk_not_live`  | 3    | it unlocks with the last good policy; the file is refused or not loaded |
//! | `degraded`       | 4    | it unlocks, but not all the policy says (policy.toml missing, a profile unverified or the verification file refused), or its health is unknown |
//! | `unlocks_nothing`| 5    | every check-in is stock: no daemon answers, no policy has been live, or the audit log cannot take records |

use std::path::Path;

use metalift_daemon::service::health::{code, Cause, Effect, State};
use metalift_daemon::service::status::{StatusError, StatusReport};

use crate::daemon_args::DaemonArgs;
use metalift_policy::{
    policy_files, read_policy_within, sources_sha256, LoadError, DEFAULT_MAX_POLICY_BYTES,
};
use serde::Serialize;

/// Exit status: healthy.
pub const EXIT_HEALTHY: u8 = 0;
/// Exit status: the last good policy unlocks; the file on disk is not live.
pub const EXIT_DISK_NOT_LIVE: u8 = 3;
/// Exit status: unlocks, but degraded (or its health is unknown).
pub const EXIT_DEGRADED: u8 = 4;
/// Exit status: unlocks nothing (includes: no daemon answers).
pub const EXIT_UNLOCKS_NOTHING: u8 = 5;

/// How far the daemon is from unlocking as the file on disk says. The order is
/// the ladder: a later level is worse and has a higher exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Unlocks as the file on disk says.
    Healthy,
    /// Unlocks with the last good policy; the file on disk is not what is live.
    DiskNotLive,
    /// Unlocks, but not everything the policy says, or nobody can tell.
    Degraded,
    /// Every check-in is answered stock.
    UnlocksNothing,
}

impl Level {
    /// The ladder's exit status.
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            Level::Healthy => EXIT_HEALTHY,
            Level::DiskNotLive => EXIT_DISK_NOT_LIVE,
            Level::Degraded => EXIT_DEGRADED,
            Level::UnlocksNothing => EXIT_UNLOCKS_NOTHING,
        }
    }

    /// The word `status --json` prints as `state`.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Level::Healthy => "healthy",
            Level::DiskNotLive => "disk_not_live",
            Level::Degraded => "degraded",
            Level::UnlocksNothing => "unlocks_nothing",
        }
    }
}

/// A cause with the level it puts the daemon at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// A stable code: the daemon's health codes, plus `daemon_unreachable` and `disk_not_live`.
    pub code: String,
    /// What is wrong, for an admin.
    pub message: String,
    /// What it does to unlocking.
    pub level: Level,
}

/// The daemon did not answer.
pub const DAEMON_UNREACHABLE: &str = "daemon_unreachable";
/// The file on disk is not the live policy (not loaded yet, or too large for the daemon).
pub const DISK_NOT_LIVE: &str = "disk_not_live";

impl From<Effect> for Level {
    fn from(effect: Effect) -> Level {
        match effect {
            Effect::DiskNotLive => Level::DiskNotLive,
            Effect::Degraded => Level::Degraded,
            Effect::UnlocksNothing => Level::UnlocksNothing,
        }
    }
}

/// The level a daemon health cause puts it at: the effect the daemon sent with
/// it, rendered, never re-derived from the code here. A daemon older than the
/// `effect` field sends none: then the daemon crate's own table ([`Effect::of`],
/// the one the daemon uses, compiled into this CLI) classifies the code, so an
/// older daemon's cause reads as this version's daemon would send it, and a code
/// this version does not know reads as degraded (never milder).
#[must_use]
pub fn level_of(cause: &Cause) -> Level {
    cause
        .effect
        .unwrap_or_else(|| Effect::of(&cause.code))
        .into()
}

/// The file on disk, as this process can see it: hashed, never parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disk {
    /// Read, with its hash.
    Hashed(String),
    /// `policy.toml` does not exist (the daemon keeps its live policy).
    Missing,
    /// Larger than the daemon's limit: not read (the daemon refuses it unread too).
    TooLarge {
        /// Its files' total size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// Could not be read here (e.g. not readable by this user).
    Unreadable(String),
}

/// Hashes the policy on disk with the policy crate's function (the daemon's),
/// without parsing it, within the daemon's `limit` (from its status, not a default).
#[must_use]
pub fn read_disk(policy: &Path, limit: u64) -> Disk {
    match policy_files(policy) {
        Ok((_, bytes)) if bytes > limit => return Disk::TooLarge { bytes, limit },
        Ok(_) => {}
        Err(LoadError::NotFound { .. }) => return Disk::Missing,
        Err(other) => return Disk::Unreadable(other.to_string()),
    }
    match read_policy_within(policy, limit) {
        Ok(read) => Disk::Hashed(sources_sha256(&read.sources)),
        Err(LoadError::NotFound { .. }) => Disk::Missing,
        Err(LoadError::TooLarge { bytes, limit, .. }) => Disk::TooLarge { bytes, limit },
        Err(other) => Disk::Unreadable(other.to_string()),
    }
}

/// The judgement: the level (the worst finding's), every finding cause first,
/// and what it was judged from.
#[derive(Debug, Clone)]
pub struct Judgement {
    /// The worst finding's level; `Healthy` without findings.
    pub level: Level,
    /// Cause first.
    pub findings: Vec<Finding>,
    /// The daemon's report, when it answered.
    pub report: Option<StatusReport>,
    /// Why it could not be asked, when it did not.
    pub error: Option<String>,
    /// The file on disk, when the daemon answered (read with its limit).
    pub disk: Option<Disk>,
}

impl Judgement {
    /// The ladder's exit status.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        self.level.exit_code()
    }

    /// This judgement without the findings of `code`: for a tool told by name to
    /// accept that cause (`doctor --forward-unreachable-ok`, `forward_behind`), the
    /// level from the findings left.
    #[must_use]
    pub fn without(mut self, code: &str) -> Judgement {
        self.findings.retain(|f| f.code != code);
        self.level = self
            .findings
            .iter()
            .map(|f| f.level)
            .max()
            .unwrap_or(Level::Healthy);
        self
    }

    /// The first finding (the one to fix first).
    #[must_use]
    pub fn cause(&self) -> Option<&Finding> {
        self.findings.first()
    }

    /// `"<message> (<code>)"` of the first finding, the line every tool prints.
    #[must_use]
    pub fn cause_line(&self) -> Option<String> {
        self.cause().map(|f| format!("{} ({})", f.message, f.code))
    }

    /// The limit the daemon enforces (its status), else the compiled default
    /// (an older daemon, or none answering).
    #[must_use]
    pub fn max_policy_bytes(&self) -> u64 {
        self.report
            .as_ref()
            .and_then(|r| r.max_policy_bytes)
            .unwrap_or(DEFAULT_MAX_POLICY_BYTES)
    }

    /// The host chip's brand as the daemon reads it (its status); `None` when it
    /// did not answer, is older, or cannot read its chip either.
    #[must_use]
    pub fn host_chip_brand(&self) -> Option<String> {
        self.report.as_ref().and_then(|r| r.host_chip_brand.clone())
    }

    /// The one line every tool that is not `status` prints about the daemon:
    /// `metaliftd: <level>: <cause> (<code>)`, or that it is healthy.
    #[must_use]
    pub fn line(&self) -> String {
        match self.cause_line() {
            Some(cause) => format!("metaliftd: {}: {cause}", self.level.word()),
            None => format!(
                "metaliftd: {}: it unlocks as the file on disk says",
                self.level.word()
            ),
        }
    }

    /// The judgement as a JSON member (`"daemon"` of `validate --json`, `"judgement"`
    /// of `edit --json`): `{"state", "code", "cause", "findings", "pid",
    /// "max_policy_bytes", "host_chip_brand", "error"}`.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "state": self.level.word(),
            "code": self.exit_code(),
            "cause": self.cause(),
            "findings": self.findings,
            "pid": self.report.as_ref().map(|r| r.pid),
            "max_policy_bytes": self.max_policy_bytes(),
            "host_chip_brand": self.host_chip_brand(),
            "error": self.error,
        })
    }
}

/// The limits a policy is judged with where it will be loaded: the daemon's
/// (from its status) when one was asked and answered, else the compiled
/// default and this machine's chip. `edit` and `validate` take these, as `doctor` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The total policy size the daemon loads.
    pub max_policy_bytes: u64,
    /// What `apple_family_max = "host"` resolves to (`None`: unknown here).
    pub host_chip_brand: Option<String>,
}

impl Limits {
    /// From `judged` (a daemon's answer), falling back for what it did not report.
    #[must_use]
    pub fn of(judged: Option<&Judgement>) -> Limits {
        Limits {
            max_policy_bytes: judged.map_or(DEFAULT_MAX_POLICY_BYTES, Judgement::max_policy_bytes),
            host_chip_brand: judged
                .and_then(Judgement::host_chip_brand)
                .or_else(metalift_daemon::live_policy::host_chip::machine_brand),
        }
    }
}

/// The host chip and macOS build as the daemon on `socket` reads them (its
/// status), so a verification records what the daemon will compare; with no
/// daemon answering (or an older one), this process's reading, and why the
/// daemon's was not had.
#[must_use]
pub fn daemon_host_build(
    daemon: &DaemonArgs,
    socket: Option<&Path>,
) -> (
    metalift_daemon::live_policy::verification::HostBuild,
    Option<String>,
) {
    use metalift_daemon::live_policy::{host_chip, host_os, verification::HostBuild};
    let own = || HostBuild {
        chip: host_chip::daemon_host().brand.clone(),
        os_build: host_os::os_build(),
    };
    let Some(socket) = socket else {
        return (own(), Some("no daemon socket known".into()));
    };
    match daemon.status(socket) {
        Ok(report) if report.host_chip_brand.is_some() || report.host_os_build.is_some() => (
            HostBuild {
                chip: report.host_chip_brand,
                os_build: report.host_os_build,
            },
            None,
        ),
        Ok(_) => (
            own(),
            Some(format!(
                "metaliftd on {} does not report its host chip and build",
                socket.display()
            )),
        ),
        Err(e) => (own(), Some(e.to_string())),
    }
}

/// Asks the daemon on `socket` as `daemon` says (its timeout) and judges its
/// answer: the one ask every command's judgement starts from. (Here, not on
/// `DaemonArgs`: the judgement needs the arguments, not the other way round.)
#[must_use]
pub fn ask(daemon: &DaemonArgs, socket: &Path) -> Judgement {
    judge(daemon.status(socket), socket)
}

/// Says the judgement of the daemon on `socket` on stderr, as `metalift: <tool>:
/// metaliftd: <level>: <cause>` (for a tool whose stdout is its own result, e.g.
/// `verify`); nothing when no socket is known.
pub fn say_on_stderr(tool: &str, daemon: &DaemonArgs, socket: Option<&Path>) {
    if let Some(socket) = socket {
        eprintln!("metalift: {tool}: {}", ask(daemon, socket).line());
    }
}

/// Judges a status answer (or its failure).
#[must_use]
pub fn judge(answer: Result<StatusReport, StatusError>, _socket: &Path) -> Judgement {
    let report = match answer {
        Ok(report) => report,
        Err(err) => {
            let error = err.to_string();
            return Judgement {
                level: Level::UnlocksNothing,
                findings: vec![Finding {
                    code: DAEMON_UNREACHABLE.to_owned(),
                    message: format!("{error}: every process runs stock"),
                    level: Level::UnlocksNothing,
                }],
                report: None,
                error: Some(error),
                disk: None,
            };
        }
    };
    let mut findings: Vec<Finding> = report
        .health
        .causes
        .iter()
        .map(|c: &Cause| Finding {
            code: c.code.clone(),
            message: c.message.clone(),
            level: level_of(c),
        })
        .collect();
    if report.health.state == State::Unknown && findings.is_empty() {
        findings.push(Finding {
            code: code::HEALTH_UNKNOWN.to_owned(),
            message: "metaliftd reports its health as unknown".to_owned(),
            level: Level::Degraded,
        });
    }
    let limit = report.max_policy_bytes.unwrap_or(DEFAULT_MAX_POLICY_BYTES);
    let disk = read_disk(Path::new(&report.policy_path), limit);
    let refused_or_missing = report
        .health
        .causes
        .iter()
        .any(|c| c.code == code::POLICY_REJECTED || c.code == code::POLICY_MISSING);
    if !refused_or_missing {
        let not_live = match &disk {
            Disk::Hashed(sha) if *sha != report.policy_sha256 => Some(format!(
                "the file on disk (sha256 {sha}) is not the live policy (sha256 {}): the daemon \
                 has not loaded it yet (SIGHUP reloads; `metalift validate` checks it)",
                report.policy_sha256
            )),
            Disk::TooLarge { bytes, limit } => Some(format!(
                "the policy on disk is {bytes} bytes, over the daemon's {limit}-byte limit: \
                 it will be refused unread"
            )),
            _ => None,
        };
        if let Some(message) = not_live {
            findings.push(Finding {
                code: DISK_NOT_LIVE.to_owned(),
                message,
                level: Level::DiskNotLive,
            });
        }
    }
    // Cause first: the worst level leads; the daemon's own order within a level.
    findings.sort_by_key(|f| std::cmp::Reverse(f.level));
    let level = findings
        .iter()
        .map(|f| f.level)
        .max()
        .unwrap_or(Level::Healthy);
    Judgement {
        level,
        findings,
        report: Some(report),
        error: None,
        disk: Some(disk),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metalift_policy::wire::ClientError;
    use std::time::Duration;

    fn old(code: &str) -> Cause {
        Cause {
            effect: None,
            ..Cause::new(code, "m".into())
        }
    }

    #[test]
    fn unlocking_nothing_is_never_milder_than_degraded() {
        assert!(Level::UnlocksNothing.exit_code() > Level::Degraded.exit_code());
        assert!(Level::Degraded.exit_code() > Level::DiskNotLive.exit_code());
        assert!(level_of(&old(code::NOTHING_LIVE)) > level_of(&old(code::POLICY_MISSING)));
        assert!(level_of(&old(code::AUDIT_WRITE_FAILED)) > level_of(&old(code::UNVERIFIED)));
        assert_eq!(
            level_of(&old("a_cause_from_a_newer_daemon")),
            Level::Degraded
        );
    }

    #[test]
    fn the_effect_the_daemon_sent_is_rendered_not_re_derived() {
        let sent = Cause {
            effect: Some(Effect::UnlocksNothing),
            ..old("a_cause_from_a_newer_daemon")
        };
        assert_eq!(level_of(&sent), Level::UnlocksNothing);
        let sent = Cause {
            effect: Some(Effect::DiskNotLive),
            ..old(code::AUDIT_WRITE_FAILED)
        };
        assert_eq!(level_of(&sent), Level::DiskNotLive);
    }

    #[test]
    fn no_daemon_unlocks_nothing() {
        let j = judge(
            Err(StatusError::Client(ClientError::NoAnswer {
                socket: "/x".into(),
                timeout: Duration::from_secs(1),
            })),
            Path::new("/x"),
        );
        assert_eq!(j.level, Level::UnlocksNothing);
        assert_eq!(j.cause().map(|f| f.code.as_str()), Some(DAEMON_UNREACHABLE));
    }
}
