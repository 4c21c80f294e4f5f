//! The other workspace binaries these tests drive beside `metalift`.
//!
//! cargo builds for an integration test only the binaries of its own package, so
//! `metaliftd` (package metalift-daemon), `metalift-probe` and libmetalift are
//! found beside `metalift` in the profile directory (`target/<profile>/`), not
//! through `CARGO_BIN_EXE_*`. A missing one fails the test with the fix; it never
//! skips.

// Each test binary uses the part it needs.
#![allow(dead_code)]

#[path = "../../../daemon/tests/record_schema.rs"]
mod record_schema;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{CheckIn, Client, VerdictMsg};
use serde_json::Value;

/// The longest any single wait may take before a test calls it a hang.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// `name` (`metaliftd`, `metalift-probe`, `libmetalift.so`) from this build, beside `metalift`.
pub fn workspace_binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_metalift")).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The simulated Metal's `normal` variant (its directory, for `LD_LIBRARY_PATH`),
/// as the probe that was built against it reports it.
pub fn simmetal_normal() -> PathBuf {
    let out = Command::new(workspace_binary("metalift-probe"))
        .arg("--simmetal-dir")
        .output()
        .expect("metalift-probe --simmetal-dir");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("normal")
}

/// A running metaliftd (the one scratch daemon, [`ScratchDaemon`]); killed on drop.
pub struct Daemon {
    process: ScratchDaemon,
    /// Where it listens.
    pub socket: PathBuf,
}

impl Daemon {
    /// Runs `cmd` (a metaliftd command line listening on `socket`) and returns once
    /// it answers a status request.
    pub fn spawn(cmd: Command, socket: PathBuf) -> Daemon {
        let process = ScratchDaemon::spawn_on(cmd, &socket, None).unwrap_or_else(|e| panic!("{e}"));
        Daemon { process, socket }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends SIGTERM (what launchd and systemd send to stop it) and waits up to
    /// `bound` for it to exit: its exit status, or `None` if it is still running.
    pub fn terminate(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        self.process.terminate(bound).expect("SIGTERM")
    }
}

/// A test's temporary directory laid out for one metaliftd at a time, as
/// installed (the one scratch daemon's [`ScratchDir`]: `etc/policy.toml`,
/// `run/metalift.sock`, `log/audit.jsonl`, and `daemon.log`, its stderr).
pub struct DaemonDir {
    _dir: tempfile::TempDir,
    scratch: ScratchDir,
}

impl std::ops::Deref for DaemonDir {
    type Target = ScratchDir;

    fn deref(&self) -> &ScratchDir {
        &self.scratch
    }
}

impl DaemonDir {
    /// A fresh directory under the target's temporary directory, named `prefix…`.
    pub fn new(prefix: &str) -> DaemonDir {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let scratch = ScratchDir::new(dir.path()).expect("layout");
        DaemonDir { _dir: dir, scratch }
    }

    /// Starts the real metaliftd on these files with the development flag, `extra`
    /// arguments and `envs`, and returns once it answers a status request.
    pub fn start(&self, extra: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let mut cmd = self
            .command(&workspace_binary("metaliftd"))
            .expect("command");
        cmd.arg("--allow-insecure-owner")
            .args(extra)
            .env_remove("METALIFT_HOST_CHIP_BRAND")
            .envs(envs.iter().copied());
        let process = ScratchDaemon::spawn(cmd, self).unwrap_or_else(|e| panic!("{e}"));
        Daemon {
            process,
            socket: self.socket(),
        }
    }

    /// The audit records of `kind` so far.
    pub fn records_of(&self, kind: &str) -> Vec<Value> {
        records_of(&self.audit_log(), kind)
    }
}

/// The audit records of `kind` in `log` (none when it does not exist yet), each
/// valid by the record schema.
pub fn records_of(log: &Path, kind: &str) -> Vec<Value> {
    record_schema::valid_records(log)
        .into_iter()
        .filter(|r| r["kind"] == kind)
        .collect()
}

/// One check-in from this process through the one client; the verdict.
pub fn check_in(socket: &Path) -> VerdictMsg {
    let check_in = CheckIn {
        shim_version: "test".into(),
        arch: std::env::consts::ARCH.into(),
        claimed_executable: None,
        job: None,
    };
    Client::connect(socket, HANG_GUARD)
        .and_then(|mut c| c.check_in(&check_in))
        .unwrap_or_else(|e| panic!("{e}"))
}
