//! After an install: did metaliftd make the new policy live? Polls the daemon's
//! status (bounded) until its live hash is the new one, or its last reload error
//! changes (a refusal), or time runs out (then a reload error still standing is
//! the refusal).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use metalift_daemon::service::status::{StatusError, StatusReport};
use metalift_policy::wire::ClientError;

use crate::daemon_args::DaemonArgs;

/// What the daemon did with the new policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Live {
    /// No daemon answers: the policy goes live when it starts.
    NoDaemon(String),
    /// A daemon accepted the connection but did not answer in time (hung or
    /// overloaded): whether it loaded the policy is unknown.
    NoAnswer(String),
    /// The daemon serves the new hash.
    Serving {
        /// The daemon's pid.
        pid: u32,
    },
    /// The daemon refused it (its last reload error).
    Refused(String),
    /// The daemon still serves another hash.
    Timeout {
        /// The hash it serves.
        serving: String,
        /// Its policy file, when it is not the one edited.
        policy_path: String,
    },
}

/// The daemon's state before the install, to tell a new refusal from an old one.
#[derive(Debug)]
pub struct Before {
    socket: Result<std::path::PathBuf, String>,
    report: Option<StatusReport>,
    daemon: DaemonArgs,
}

/// Looks at the daemon before installing.
#[must_use]
pub fn snapshot(daemon: &DaemonArgs) -> Before {
    let socket = daemon.socket().map_err(|e| e.to_string());
    let report = socket.as_ref().ok().and_then(|s| daemon.status(s).ok());
    Before {
        socket,
        report,
        daemon: daemon.clone(),
    }
}

/// Waits up to `timeout` for `hash` to be live.
#[must_use]
pub fn wait(before: Before, policy: &Path, hash: &str, timeout: Duration) -> Live {
    let socket = match before.socket {
        Ok(s) => s,
        Err(e) => return Live::NoDaemon(e),
    };
    let old_error = before.report.and_then(|r| r.last_reload_error);
    let deadline = Instant::now() + timeout;
    loop {
        let report = match before.daemon.status(&socket) {
            Ok(r) => r,
            Err(e @ StatusError::Client(ClientError::NoAnswer { .. })) => {
                return Live::NoAnswer(e.to_string())
            }
            Err(e) => return Live::NoDaemon(e.to_string()),
        };
        if report.policy_sha256 == hash {
            return Live::Serving { pid: report.pid };
        }
        if let Some(err) = &report.last_reload_error {
            if Some(err) != old_error.as_ref() {
                return Live::Refused(err.clone());
            }
        }
        if Instant::now() >= deadline {
            // The same refusal as before the install (e.g. a drop-in the daemon
            // already refused): the new file did not make it live either.
            if let Some(err) = report.last_reload_error {
                return Live::Refused(err);
            }
            let policy_path = if Path::new(&report.policy_path) == policy {
                String::new()
            } else {
                report.policy_path
            };
            return Live::Timeout {
                serving: report.policy_sha256,
                policy_path,
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Live {
    /// One line for the admin.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            // The status client's error already says "no daemon answers: ...".
            Live::NoDaemon(why) if why.starts_with("no daemon answers") => {
                format!("{why}: the policy goes live when metaliftd starts")
            }
            Live::NoDaemon(why) => {
                format!("no daemon answers ({why}): the policy goes live when metaliftd starts")
            }
            Live::NoAnswer(why) => {
                format!(
                    "{why}: whether the new policy is live is unknown (`metalift status` tells)"
                )
            }
            Live::Serving { pid } => format!("live in metaliftd (pid {pid})"),
            Live::Refused(err) => {
                format!("metaliftd refused it; the previous policy stays live:\n{err}")
            }
            Live::Timeout {
                serving,
                policy_path,
            } if !policy_path.is_empty() => {
                format!("metaliftd serves {policy_path} (sha256 {serving}), not the file edited")
            }
            Live::Timeout { serving, .. } => {
                format!("metaliftd still serves sha256 {serving}: see `metalift status`")
            }
        }
    }

    /// The `daemon` member of `--json` output.
    #[must_use]
    pub fn to_json(&self) -> Value {
        match self {
            Live::NoDaemon(why) => json!({"state": "no_daemon", "detail": why}),
            Live::NoAnswer(why) => json!({"state": "no_answer", "detail": why}),
            Live::Serving { pid } => json!({"state": "live", "pid": pid}),
            Live::Refused(err) => json!({"state": "refused", "detail": err}),
            Live::Timeout { serving, .. } => json!({"state": "timeout", "serving": serving}),
        }
    }
}
