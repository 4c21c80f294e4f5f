//! A throw-away metaliftd on a directory of its own: the one scratch daemon that
//! `metalift demo` and `metalift verify`, the benchmarks and every test crate start.
//!
//! [`ScratchDir`] lays the directory out as installed (`etc/policy.toml`,
//! `run/metalift.sock`, `log/audit.jsonl`, and `daemon.log` for the daemon's
//! stderr) and reads the records back; [`ScratchDaemon`] is one metaliftd running
//! on it, started once it answers a status request, killed when dropped. They are
//! apart because a daemon may be stopped and started again on the same files.
//!
//! It lives in the daemon's library because product code uses it (`demo`,
//! `verify`), and every crate that starts a metaliftd can depend on this one.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use metalift_policy::wire::{CheckIn, Client, ClientError, VerdictMsg};
use serde_json::Value;

/// How long a daemon may take to answer its first status request (a cold, loaded
/// 2-core CI box): past it, starting fails.
pub const START_PATIENCE: Duration = Duration::from_secs(60);

/// How long [`ScratchDaemon::stop`] waits after SIGTERM before SIGKILL (a loaded
/// CI box; a daemon that exits promptly is not held up by it).
pub const STOP_PATIENCE: Duration = Duration::from_secs(60);

/// Why a scratch daemon could not be set up, started, or read back.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// metaliftd exited before it answered.
    #[error("metaliftd exited at start ({status}):\n{log}")]
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// Its stderr.
        log: String,
    },
    /// metaliftd did not answer a status request within [`START_PATIENCE`].
    #[error("metaliftd on {} did not answer within {START_PATIENCE:?} (last: {last}):\n{log}", socket.display())]
    NoAnswer {
        /// Its socket.
        socket: PathBuf,
        /// The last client error.
        last: String,
        /// Its stderr.
        log: String,
    },
    /// A whole line of the audit log is not JSON.
    #[error("{}:{line}: not an audit record: {error}", log.display())]
    Record {
        /// The audit log.
        log: PathBuf,
        /// The line number (from 1).
        line: usize,
        /// The parse error.
        error: serde_json::Error,
    },
}

fn io(what: impl std::fmt::Display, path: &Path) -> impl FnOnce(std::io::Error) -> ScratchError {
    let what = format!("{what} {}", path.display());
    move |source| ScratchError::Io { what, source }
}

/// A directory laid out for one metaliftd at a time, as installed.
#[derive(Debug, Clone)]
pub struct ScratchDir {
    root: PathBuf,
}

impl ScratchDir {
    /// Lays out `root` (created if missing): `etc/` (mode 0755: a policy directory
    /// others can write is refused when ownership is checked), `run/` and `log/`.
    /// The policy's directory holds nothing else: the watcher reloads on any event
    /// there, and an audit log written beside the policy would keep postponing reloads.
    pub fn new(root: impl Into<PathBuf>) -> Result<ScratchDir, ScratchError> {
        let dir = ScratchDir { root: root.into() };
        for sub in ["etc", "run", "log"] {
            let path = dir.path(sub);
            std::fs::create_dir_all(&path).map_err(io("creating", &path))?;
        }
        let etc = dir.path("etc");
        std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755))
            .map_err(io("chmod 0755", &etc))?;
        Ok(dir)
    }

    /// The directory itself.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` under the directory.
    #[must_use]
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `etc/policy.toml`.
    #[must_use]
    pub fn policy(&self) -> PathBuf {
        self.path("etc/policy.toml")
    }

    /// `run/metalift.sock`.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.path("run/metalift.sock")
    }

    /// `log/audit.jsonl`.
    #[must_use]
    pub fn audit_log(&self) -> PathBuf {
        self.path("log/audit.jsonl")
    }

    /// `daemon.log`: the daemon's stderr (its diagnostics), appended to by every
    /// daemon started here (outside `log/`, which holds what metaliftd writes there
    /// when installed: the audit log, its rotations and the forwarder's cursor).
    #[must_use]
    pub fn daemon_log(&self) -> PathBuf {
        self.path("daemon.log")
    }

    /// The daemon's stderr so far (empty when there is none).
    #[must_use]
    pub fn daemon_log_text(&self) -> String {
        std::fs::read_to_string(self.daemon_log()).unwrap_or_default()
    }

    /// Replaces the policy as an editor's atomic save does: a temporary file beside
    /// it (mode 0644), renamed over it.
    pub fn write_policy(&self, text: &str) -> Result<(), ScratchError> {
        let path = self.policy();
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text).map_err(io("writing", &tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
            .map_err(io("chmod 0644", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming over", &path))
    }

    /// `metaliftd` on these files (`--policy`, `--socket`, `--audit-log`), stdin
    /// and stdout to /dev/null, stderr appended to [`ScratchDir::daemon_log`]. The
    /// caller adds flags and environment, then [`ScratchDaemon::spawn`]s it.
    pub fn command(&self, metaliftd: &Path) -> Result<Command, ScratchError> {
        let log = self.daemon_log();
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io("opening", &log))?;
        let mut cmd = Command::new(metaliftd);
        cmd.arg("--policy")
            .arg(self.policy())
            .arg("--socket")
            .arg(self.socket())
            .arg("--audit-log")
            .arg(self.audit_log())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        Ok(cmd)
    }

    /// Starts `metaliftd` on these files (the policy written first, e.g. with
    /// [`ScratchDir::write_policy`]) with the development flag
    /// `--allow-insecure-owner` (the files are the caller's, not root's), `extra`
    /// flags and `envs`; returns once it answers.
    pub fn start<S: AsRef<OsStr>>(
        &self,
        metaliftd: &Path,
        extra: &[S],
        envs: &[(&str, &str)],
    ) -> Result<ScratchDaemon, ScratchError> {
        let mut cmd = self.command(metaliftd)?;
        cmd.arg("--allow-insecure-owner")
            .args(extra)
            .envs(envs.iter().copied());
        ScratchDaemon::spawn(cmd, self)
    }

    /// Every audit record in `log/audit.jsonl` so far ([`records_in`]).
    pub fn records(&self) -> Result<Vec<Value>, ScratchError> {
        records_in(&self.audit_log())
    }

    /// The audit records of `kind` so far, in the order written.
    pub fn records_of(&self, kind: &str) -> Result<Vec<Value>, ScratchError> {
        Ok(self
            .records()?
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect())
    }
}

/// Every audit record in `log` so far (none when it does not exist yet). Only
/// newline-terminated lines count: a read racing an append may see the start of
/// a line being written. A whole line that is not JSON is an error.
pub fn records_in(log: &Path) -> Result<Vec<Value>, ScratchError> {
    let mut text = match std::fs::read_to_string(log) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io("reading", log)(e)),
    };
    text.truncate(text.rfind('\n').map_or(0, |i| i + 1));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|error| ScratchError::Record {
                log: log.to_owned(),
                line: i + 1,
                error,
            })
        })
        .collect()
}

/// A running metaliftd; killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct ScratchDaemon {
    child: Child,
    socket: PathBuf,
}

impl ScratchDaemon {
    /// Runs `cmd` (a metaliftd command line on `dir`'s socket, e.g. from
    /// [`ScratchDir::command`]) and returns once it answers a status request.
    pub fn spawn(cmd: Command, dir: &ScratchDir) -> Result<ScratchDaemon, ScratchError> {
        Self::spawn_on(cmd, &dir.socket(), Some(&dir.daemon_log()))
    }

    /// [`ScratchDaemon::spawn`] for a command line that listens on `socket` and
    /// writes its stderr to `daemon_log`, if anywhere (quoted if it fails to start).
    pub fn spawn_on(
        mut cmd: Command,
        socket: &Path,
        daemon_log: Option<&Path>,
    ) -> Result<ScratchDaemon, ScratchError> {
        let child = cmd
            .spawn()
            .map_err(io("starting", Path::new(cmd.get_program())))?;
        let mut daemon = ScratchDaemon {
            child,
            socket: socket.to_owned(),
        };
        let log = || {
            daemon_log
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default()
        };
        let start = Instant::now();
        loop {
            let last = match Client::status(socket, Duration::from_secs(5)) {
                Ok(_) => return Ok(daemon),
                Err(e) => e.to_string(),
            };
            if let Some(status) = daemon
                .child
                .try_wait()
                .map_err(io("waiting for", Path::new(cmd.get_program())))?
            {
                return Err(ScratchError::Exited { status, log: log() });
            }
            if start.elapsed() > START_PATIENCE {
                return Err(ScratchError::NoAnswer {
                    socket: socket.to_owned(),
                    last,
                    log: log(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Where it listens.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its exit status if it has exited (reaping it), `None` while it runs.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Sends SIGTERM (what launchd and systemd send; the daemon records
    /// `daemon_stop`) and waits up to `bound`: its exit status, or `None` if it
    /// is still running.
    pub fn terminate(&mut self, bound: Duration) -> std::io::Result<Option<ExitStatus>> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(Some(status));
        }
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if start.elapsed() > bound {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then SIGKILL if it lingers past [`STOP_PATIENCE`]: how it exited
    /// (killed by a signal if it had to be).
    pub fn stop(mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.terminate(STOP_PATIENCE)? {
            return Ok(status);
        }
        self.child.kill()?;
        self.child.wait()
    }

    /// SIGKILL (a crash, as far as the daemon can tell), and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ScratchDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One check-in at `socket` as a shim that claims no executable makes it, with
/// `shim_version` and the job claim `job`: the verdict, and the client still open
/// for the outcome: the daemon tests' one way to make a decision.
pub fn check_in(
    socket: &Path,
    shim_version: &str,
    job: Option<&str>,
    timeout: Duration,
) -> Result<(Client, VerdictMsg), ClientError> {
    let mut client = Client::connect(socket, timeout)?;
    let verdict = client.check_in(&CheckIn {
        shim_version: shim_version.to_owned(),
        arch: std::env::consts::ARCH.to_owned(),
        claimed_executable: None,
        job: job.map(str::to_owned),
    })?;
    Ok((client, verdict))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_the_whole_lines_and_a_bad_whole_line_is_an_error() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = ScratchDir::new(tmp.path()).expect("layout");
        assert!(dir.records().expect("no log yet").is_empty());
        std::fs::write(
            dir.audit_log(),
            "{\"kind\":\"decision\"}\n{\"kind\":\"outcome\"}\n{\"kind\":\"deci",
        )
        .expect("log");
        assert_eq!(dir.records().expect("records").len(), 2);
        assert_eq!(dir.records_of("outcome").expect("records").len(), 1);
        std::fs::write(dir.audit_log(), "{\"kind\":\"decision\"}\nnot json\n").expect("log");
        assert!(matches!(
            dir.records(),
            Err(ScratchError::Record { line: 2, .. })
        ));
    }

    #[test]
    fn a_daemon_that_exits_at_start_is_an_error_with_its_log() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = ScratchDir::new(tmp.path()).expect("layout");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo refused >&2; exit 3"])
            .stderr(std::fs::File::create(dir.daemon_log()).expect("log"));
        let err = ScratchDaemon::spawn(cmd, &dir).expect_err("exited");
        assert!(
            matches!(&err, ScratchError::Exited { log, .. } if log.contains("refused")),
            "{err}"
        );
    }
}
