//! The reliability suite's harness: a real metaliftd on an isolated directory
//! laid out as installed (policy, socket and audit log in separate directories),
//! raw-protocol clients, and the short/long switch.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use metalift_policy::wire::{self, CheckIn, Message, VerdictMsg, LENGTH_PREFIX};
use serde_json::Value;

/// The longest any single step may take before a test calls it a hang. Generous:
/// the suite runs on loaded 2-core CI machines; nothing asserts on speed.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// `METALIFT_RELIABILITY=long` selects the long form (tens of thousands of
/// check-ins, thousands more hostile connections); anything else the short form CI runs.
pub fn long_form() -> bool {
    std::env::var("METALIFT_RELIABILITY").is_ok_and(|v| v == "long")
}

/// `short` in CI, `long` with `METALIFT_RELIABILITY=long`.
pub fn scale(short: usize, long: usize) -> usize {
    if long_form() {
        long
    } else {
        short
    }
}

/// An isolated directory: `etc/policy.toml`, `run/metalift.sock`, `log/audit.jsonl`.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new(prefix: &str) -> Env {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        for sub in ["etc", "run", "log"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("layout");
        }
        // The policy's directory must not be writable by others when ownership is checked.
        std::fs::set_permissions(
            dir.path().join("etc"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod etc");
        Env { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn policy(&self) -> PathBuf {
        self.path("etc/policy.toml")
    }

    pub fn socket(&self) -> PathBuf {
        self.path("run/metalift.sock")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.path("log/audit.jsonl")
    }

    /// Replaces `policy.toml` as an editor's atomic save does (temp file, mode
    /// 0644, rename over).
    pub fn write_policy(&self, text: &str) {
        write_atomically(&self.policy(), text, 0o644);
    }

    /// Starts metaliftd on this directory with `extra` flags, and waits until it answers.
    pub fn start(&self, extra: &[&str]) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metaliftd"));
        cmd.arg("--policy")
            .arg(self.policy())
            .arg("--socket")
            .arg(self.socket())
            .arg("--audit-log")
            .arg(self.audit_log())
            // Tests read every record back: no rotation within a run.
            .args(["--audit-max-bytes", "4294967296"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.path("daemon.log"))
                    .expect("daemon log"),
            );
        let child = cmd.spawn().expect("spawn metaliftd");
        let mut daemon = Daemon { child };
        let start = Instant::now();
        while status(&self.socket()).is_none() {
            if let Some(exit) = daemon.child.try_wait().expect("try_wait") {
                panic!(
                    "metaliftd exited at start ({exit}):\n{}",
                    std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
                );
            }
            assert!(start.elapsed() < HANG_GUARD, "metaliftd did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon
    }

    /// Every audit record, parsed; a line that is not whole JSON fails the test.
    pub fn records(&self) -> Vec<Value> {
        let mut text = std::fs::read_to_string(self.audit_log()).unwrap_or_default();
        // A read racing an append may see the start of a line being written:
        // only newline-terminated lines are records.
        let whole = text.rfind('\n').map_or(0, |i| i + 1);
        text.truncate(whole);
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
            .collect()
    }

    pub fn records_of(&self, kind: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }

    /// Waits until the audit log holds more than `n` records of `kind`.
    pub fn wait_for_records(&self, kind: &str, n: usize) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let records = self.records_of(kind);
            if records.len() > n {
                return records;
            }
            assert!(
                start.elapsed() < HANG_GUARD,
                "no new {kind} record; the log holds:\n{}",
                std::fs::read_to_string(self.audit_log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Writes `text` to a temporary file beside `path` with `mode`, then renames it over `path`.
pub fn write_atomically(path: &Path, text: &str, mode: u32) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).expect("write policy");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).expect("chmod");
    std::fs::rename(&tmp, path).expect("rename policy");
}

/// A running metaliftd; killed (SIGKILL) on drop.
pub struct Daemon {
    pub child: Child,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// SIGKILL, and reap.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then wait for the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(start.elapsed() < HANG_GUARD, "metaliftd did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The frame a shim sends.
pub fn check_in_frame() -> Vec<u8> {
    wire::encode_frame(&Message::CheckIn(CheckIn {
        shim_version: "reliability".into(),
        arch: std::env::consts::ARCH.into(),
        claimed_executable: None,
        job: None,
    }))
}

/// Reads one frame; `None` when the daemon closed the connection.
pub fn read_frame(stream: &mut UnixStream) -> std::io::Result<Option<Message>> {
    let mut prefix = [0u8; LENGTH_PREFIX];
    match stream.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    }
    let len = wire::frame_length(prefix).map_err(std::io::Error::other)?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    wire::decode_body(&body)
        .map(Some)
        .map_err(std::io::Error::other)
}

/// One check-in as a shim makes it; `Err` when it could not be made or answered.
pub fn check_in(socket: &Path) -> std::io::Result<VerdictMsg> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(HANG_GUARD))?;
    stream.write_all(&check_in_frame())?;
    match read_frame(&mut stream)? {
        Some(Message::Verdict(v)) => Ok(v),
        other => Err(std::io::Error::other(format!(
            "expected a verdict, got {other:?}"
        ))),
    }
}

/// The daemon's status, or `None` if it does not answer.
pub fn status(socket: &Path) -> Option<Value> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(HANG_GUARD)).ok()?;
    stream
        .write_all(&wire::encode_frame(&Message::StatusRequest))
        .ok()?;
    match read_frame(&mut stream).ok()? {
        Some(Message::Status(json)) => serde_json::from_str(&json).ok(),
        _ => None,
    }
}

/// This test binary, as the kernel names it (`/proc/self/exe`): the executable
/// metaliftd sees when this process checks in.
pub fn this_exe() -> PathBuf {
    std::fs::read_link("/proc/self/exe").expect("/proc/self/exe")
}

/// A TOML basic string.
pub fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The profile every test policy declares.
pub const PROFILE: &str =
    "[profile.apple7]\napple_family_max = 7\nmax_threadgroup_memory = 32768\n";

/// A policy with one rule `id` for `exe` (by exact path), unlocking or stock.
pub fn policy_for(exe: &Path, id: &str, unlock: bool) -> String {
    format!(
        "version = 1\nmode = \"enforce\"\n\n{PROFILE}\n[[rule]]\nid = \"{id}\"\npath = {}\n{}\n",
        toml_string(&exe.display().to_string()),
        if unlock {
            "unlock = \"apple7\""
        } else {
            "stock = true"
        }
    )
}

/// The sha256 metaliftd records for `text` loaded from `policy` (no `policy.d/`).
pub fn policy_sha(policy: &Path, text: &str) -> String {
    let sources = vec![metalift_policy::Source::new(
        policy.display().to_string(),
        text,
    )];
    metalift_policy::compile_sources(sources)
        .unwrap_or_else(|e| panic!("the test's own valid policy was refused: {e}\n{text}"))
        .policy
        .sha256_hex()
        .to_owned()
}

/// A record's `"time"`.
pub fn time_of(record: &Value) -> SystemTime {
    metalift_daemon::audit::record::rfc3339::parse(record["time"].as_str().expect("time"))
        .expect("RFC 3339 time")
}

/// The built probe and shim (other crates' artifacts; `scripts/test.sh` builds the
/// workspace before testing, as `exec_probe.rs` requires too).
pub struct Injection {
    pub probe: PathBuf,
    pub shim: PathBuf,
}

impl Injection {
    pub fn locate() -> Injection {
        let dir = Path::new(env!("CARGO_BIN_EXE_metaliftd"))
            .parent()
            .expect("binary has a directory")
            .to_path_buf();
        let find = |name: &str| {
            let path = dir.join(name);
            path.canonicalize().unwrap_or_else(|_| {
                panic!(
                    "{} is missing: build the workspace first (cargo build --workspace, as scripts/test.sh does)",
                    path.display()
                )
            })
        };
        Injection {
            probe: find("metalift-probe"),
            shim: find("libmetalift.so"),
        }
    }

    /// Runs the probe (`--json`) with libmetalift injected, asking `socket`, with
    /// the shim's diagnostics on stderr. Returns the report and stderr.
    pub fn run_probe(&self, socket: &Path) -> (Value, String) {
        let mut cmd = Command::new(&self.probe);
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            if key.starts_with("METALIFT_") || key == "LD_PRELOAD" || key == "LD_LIBRARY_PATH" {
                cmd.env_remove(key);
            }
        }
        let out = cmd
            .arg("--json")
            .env("LD_PRELOAD", &self.shim)
            .env("METALIFT_SOCKET", socket)
            .env("METALIFT_DEBUG", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run the probe");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "probe failed: {}\n{stderr}",
            out.status
        );
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "probe printed no JSON ({e}): {}\n{stderr}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        (report, stderr)
    }
}

/// A small deterministic generator (xorshift64) for jittered schedules.
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Jitter {
        Jitter(seed.max(1))
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Clears a "keep going" flag when dropped, so threads looping on it stop even
/// when the test thread panics inside a `std::thread::scope` (which would
/// otherwise wait for them forever).
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether `METALIFT_TEST_SKIP_ROOT=1` asks to skip (visibly) the tests that need root.
pub fn skip_root_allowed() -> bool {
    std::env::var_os("METALIFT_TEST_SKIP_ROOT").is_some_and(|v| v == "1")
}

/// Fails the calling test when not root, unless [`skip_root_allowed`]; then says
/// `SKIPPED` and returns false. CI runs as root and does not set the variable.
pub fn require_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        skip_root_allowed(),
        "{test} needs root: run the tests as root, as CI does, or set \
         METALIFT_TEST_SKIP_ROOT=1 to skip it"
    );
    eprintln!("SKIPPED {test}: not root (METALIFT_TEST_SKIP_ROOT=1)");
    false
}
