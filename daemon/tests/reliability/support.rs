//! The reliability suite's harness: a real metaliftd on an isolated directory
//! laid out as installed (policy, socket and audit log in separate directories),
//! raw-protocol clients, and the short/long switch.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{self, CheckIn, Client, ClientError, Message, VerdictMsg};
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

/// An isolated directory laid out as installed (the one scratch daemon's
/// [`ScratchDir`]: `etc/policy.toml`, `run/metalift.sock`, `log/audit.jsonl`).
pub struct Env {
    /// Removed when the test ends.
    _dir: tempfile::TempDir,
    scratch: ScratchDir,
}

impl std::ops::Deref for Env {
    type Target = ScratchDir;

    fn deref(&self) -> &ScratchDir {
        &self.scratch
    }
}

impl Env {
    pub fn new(prefix: &str) -> Env {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let scratch = ScratchDir::new(dir.path()).expect("layout");
        Env { _dir: dir, scratch }
    }

    /// Replaces `policy.toml` as an editor's atomic save does (temp file, mode
    /// 0644, rename over).
    pub fn write_policy(&self, text: &str) {
        self.scratch.write_policy(text).expect("write policy");
    }

    /// Starts metaliftd on this directory with `extra` flags, and waits until it answers.
    pub fn start(&self, extra: &[&str]) -> Daemon {
        let mut cmd = self
            .command(Path::new(env!("CARGO_BIN_EXE_metaliftd")))
            .expect("command");
        // Tests read every record back: no rotation within a run.
        cmd.args(["--audit-max-bytes", "4294967296"])
            .args(extra)
            .env("RUST_LOG", "info");
        ScratchDaemon::spawn(cmd, self).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The records of `kind`; a line that is not whole JSON fails the test.
    pub fn records_of(&self, kind: &str) -> Vec<Value> {
        self.scratch
            .records_of(kind)
            .unwrap_or_else(|e| panic!("{e}"))
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

/// A running metaliftd (the one scratch daemon); killed (SIGKILL) on drop.
pub type Daemon = ScratchDaemon;

/// The frame a shim sends (for tests that cut or corrupt it).
pub fn check_in_frame() -> Vec<u8> {
    wire::encode_frame(&Message::CheckIn(check_in_msg()))
}

fn check_in_msg() -> CheckIn {
    CheckIn {
        shim_version: "reliability".into(),
        arch: std::env::consts::ARCH.into(),
        claimed_executable: None,
        job: None,
    }
}

/// One check-in as a shim makes it; `Err` when it could not be made or answered.
pub fn check_in(socket: &Path) -> Result<VerdictMsg, ClientError> {
    metalift_daemon::scratch::check_in(socket, "reliability", None, HANG_GUARD)
        .map(|(_, verdict)| verdict)
}

/// The daemon's status, or `None` if it does not answer.
pub fn status(socket: &Path) -> Option<Value> {
    serde_json::from_str(&Client::status(socket, HANG_GUARD).ok()?).ok()
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
