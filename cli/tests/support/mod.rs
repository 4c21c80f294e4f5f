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
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metalift_policy::wire::{self, CheckIn, Message, VerdictMsg, LENGTH_PREFIX};
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

/// A running metaliftd on a temporary socket; killed on drop.
pub struct Daemon {
    child: Child,
    /// Where it listens.
    pub socket: PathBuf,
}

impl Daemon {
    /// Runs `cmd` (a metaliftd command line listening on `socket`) and returns once
    /// it answers a status request.
    pub fn spawn(mut cmd: Command, socket: PathBuf) -> Daemon {
        let daemon = Daemon {
            child: cmd.spawn().expect("spawn metaliftd"),
            socket,
        };
        let start = Instant::now();
        while metalift_daemon::service::status::request(&daemon.socket, Duration::from_secs(5))
            .is_err()
        {
            assert!(start.elapsed() < HANG_GUARD, "metaliftd did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (what launchd and systemd send to stop it) and waits up to
    /// `bound` for it to exit: its exit status, or `None` if it is still running.
    pub fn terminate(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid (not yet reaped: we hold the Child).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM");
        let start = Instant::now();
        while start.elapsed() < bound {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test's temporary directory laid out for one metaliftd: `policy.toml`,
/// `run/metalift.sock`, `log/audit.jsonl`, and `daemon.log` (its stderr).
pub struct DaemonDir {
    dir: tempfile::TempDir,
}

impl DaemonDir {
    /// A fresh directory under the target's temporary directory, named `prefix…`.
    pub fn new(prefix: &str) -> DaemonDir {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        for sub in ["run", "log"] {
            std::fs::create_dir(dir.path().join(sub)).expect("run/ and log/");
        }
        DaemonDir { dir }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn policy(&self) -> PathBuf {
        self.path("policy.toml")
    }

    pub fn socket(&self) -> PathBuf {
        self.path("run/metalift.sock")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.path("log/audit.jsonl")
    }

    /// The daemon's stderr (diagnostics), for failure messages.
    pub fn daemon_log(&self) -> PathBuf {
        self.path("daemon.log")
    }

    /// Starts the real metaliftd on these files with the development flag, `extra`
    /// arguments and `envs`, and returns once it answers a status request.
    pub fn start(&self, extra: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(workspace_binary("metaliftd"));
        cmd.arg("--policy")
            .arg(self.policy())
            .arg("--socket")
            .arg(self.socket())
            .arg("--audit-log")
            .arg(self.audit_log())
            .arg("--allow-insecure-owner")
            .args(extra)
            .env_remove("METALIFT_HOST_CHIP_BRAND")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.daemon_log()).expect("daemon log"));
        Daemon::spawn(cmd, self.socket())
    }

    /// The audit records of `kind` so far.
    pub fn records_of(&self, kind: &str) -> Vec<Value> {
        records_of(&self.audit_log(), kind)
    }
}

/// The audit records of `kind` in `log` (none when it does not exist yet).
pub fn records_of(log: &Path, kind: &str) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(record_schema::valid_record)
        .filter(|r| r["kind"] == kind)
        .collect()
}

/// One check-in from this process in the raw wire protocol; the verdict.
pub fn check_in(socket: &Path) -> VerdictMsg {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.set_read_timeout(Some(HANG_GUARD)).expect("timeout");
    let msg = Message::CheckIn(CheckIn {
        shim_version: "test".into(),
        arch: std::env::consts::ARCH.into(),
        claimed_executable: None,
        job: None,
    });
    stream.write_all(&wire::encode_frame(&msg)).expect("send");
    let mut prefix = [0u8; LENGTH_PREFIX];
    stream.read_exact(&mut prefix).expect("verdict prefix");
    let mut body = vec![0u8; wire::frame_length(prefix).expect("sane length")];
    stream.read_exact(&mut body).expect("verdict body");
    match wire::decode_body(&body).expect("decodes") {
        Message::Verdict(v) => v,
        other => panic!("expected a verdict, got {other:?}"),
    }
}
