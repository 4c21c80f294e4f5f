//! Test support: where the built artifacts are, a scripted fake metaliftd, and a
//! way to run a program with libmetalift injected.
#![allow(dead_code)]

mod real_daemon;
#[allow(unused_imports)] // each test binary uses the part it needs
pub use real_daemon::RealDaemon;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metalift_policy::profile::Capabilities;
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{self, Message, Outcome, VerdictMsg, WireAction};

/// Generous: correctness, not speed, is under test, on a loaded 2-core box.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn probe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_metalift-probe"))
}

pub fn probe_dlopen() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_metalift-probe-dlopen"))
}

/// A simulated Metal variant's directory (`normal`, `noinit`, `nows`,
/// `moved`, `cached`, `wrapper`, `lateclasses`).
pub fn simmetal(variant: &str) -> PathBuf {
    Path::new(metalift_probe::SIMMETAL_DIR).join(variant)
}

/// A hostile test program (`metalift-hostile`, `metalift-hostile-late`).
pub fn hostile(name: &str) -> PathBuf {
    Path::new(metalift_probe::SIMMETAL_DIR)
        .join("bin")
        .join(name)
}

/// libmetalift.so as built for this test run: `shim/build.rs` compiles it from
/// `shim/c/*.c` and installs it at `target/<profile>/libmetalift.so` (the
/// dev-dependency on metalift-shim makes `cargo test -p metalift-probe` build it).
pub fn shim() -> PathBuf {
    let path = PathBuf::from(metalift_shim::LIBRARY);
    assert!(
        path.is_file(),
        "libmetalift.so is built: {}",
        path.display()
    );
    path
}

/// The profile the tests unlock with.
pub const APPLE7: Capabilities = Capabilities {
    apple_family_max: 7,
    max_threadgroup_memory: 32768,
    recommended_working_set: None,
};

/// How the fake daemon answers every check-in.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// A verdict (its decision id is replaced by a per-connection counter).
    Verdict(VerdictMsg),
    /// Accept, read the check-in, never answer.
    Silent,
    /// Answer with these raw bytes.
    Raw(Vec<u8>),
}

pub fn unlock(capabilities: Capabilities) -> Behaviour {
    Behaviour::Verdict(VerdictMsg {
        decision_id: 0,
        action: WireAction::Unlock,
        capabilities: Some(capabilities),
        profile: Some("apple7".into()),
        rule: Some("probe".into()),
        mode: Mode::Enforce,
        would_unlock: false,
    })
}

pub fn stock(mode: Mode, would_unlock: bool) -> Behaviour {
    Behaviour::Verdict(VerdictMsg {
        decision_id: 0,
        action: WireAction::Stock,
        capabilities: None,
        profile: None,
        rule: Some("probe".into()),
        mode,
        would_unlock,
    })
}

/// A scripted metaliftd on a temporary Unix socket. Records every connection,
/// check-in (with the peer's pid from `SO_PEERCRED`: the kernel's word, as the
/// real daemon takes it) and outcome it receives; stops when dropped.
pub struct FakeDaemon {
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
    stop: Arc<AtomicBool>,
    record: Arc<Record>,
    acceptor: Option<JoinHandle<()>>,
}

/// What the fake daemon saw.
#[derive(Default)]
struct Record {
    connections: AtomicU64,
    check_ins: AtomicU64,
    /// The peer pid of each check-in, in arrival order.
    check_in_pids: Mutex<Vec<u32>>,
    /// Each outcome with the pid of the connection it came on.
    outcomes: Mutex<Vec<(u32, Outcome)>>,
    /// Frames that did not decode (a program's bytes in the shim's socket).
    garbage: Mutex<Vec<String>>,
}

impl FakeDaemon {
    pub fn start(behaviour: Behaviour) -> FakeDaemon {
        FakeDaemon::start_delayed(behaviour, Duration::ZERO)
    }

    /// Like [`FakeDaemon::start`], answering each check-in only after `delay`.
    pub fn start_delayed(behaviour: Behaviour, delay: Duration) -> FakeDaemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("metalift.sock");
        let listener = UnixListener::bind(&socket).expect("bind fake daemon");
        let stop = Arc::new(AtomicBool::new(false));
        let record = Arc::new(Record::default());
        let acceptor = {
            let (stop, record) = (stop.clone(), record.clone());
            // Blocking accept, so a check-in is answered at once; `drop` wakes it
            // with a connection of its own after setting `stop`.
            std::thread::spawn(move || {
                let mut next_id = 1u64;
                for stream in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    record.connections.fetch_add(1, Ordering::SeqCst);
                    let id = next_id;
                    next_id += 1;
                    let (b, s, r) = (behaviour.clone(), stop.clone(), record.clone());
                    std::thread::spawn(move || serve(stream, id, b, delay, s, r));
                }
            })
        };
        FakeDaemon {
            socket,
            _dir: dir,
            stop,
            record,
            acceptor: Some(acceptor),
        }
    }

    /// Check-ins so far, once the handlers have settled: the process that sent
    /// them has exited, but its bytes may still be on their way to a handler.
    pub fn check_ins(&self) -> u64 {
        settle();
        self.record.check_ins.load(Ordering::SeqCst)
    }

    /// Connections accepted (a process that never touches Metal makes none),
    /// once the acceptor has settled.
    pub fn connections(&self) -> u64 {
        settle();
        self.record.connections.load(Ordering::SeqCst)
    }

    /// The peer pids of the check-ins so far.
    pub fn check_in_pids(&self) -> Vec<u32> {
        self.record.check_in_pids.lock().unwrap().clone()
    }

    /// Frames that failed to decode.
    pub fn garbage(&self) -> Vec<String> {
        self.record.garbage.lock().unwrap().clone()
    }

    /// Waits (bounded) for the first outcome; the process has usually sent it
    /// before exiting, so this returns as soon as the handler has read it.
    pub fn outcome(&self) -> Outcome {
        self.outcomes_with_pids(1).remove(0).1
    }

    /// Waits (bounded) until `n` outcomes arrived; returns all so far, each
    /// with the pid of the connection it came on.
    pub fn outcomes_with_pids(&self, n: usize) -> Vec<(u32, Outcome)> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let outcomes = self.record.outcomes.lock().unwrap().clone();
            if outcomes.len() >= n {
                return outcomes;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {n} outcomes reached the daemon: {outcomes:?}",
                outcomes.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every outcome received so far (no waiting).
    pub fn outcomes_now(&self) -> Vec<(u32, Outcome)> {
        self.record.outcomes.lock().unwrap().clone()
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = UnixStream::connect(&self.socket);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Lets the fake daemon's threads catch up with a process that already exited.
fn settle() {
    std::thread::sleep(Duration::from_millis(150));
}

/// The pid of the process at the other end (`SO_PEERCRED`).
fn peer_pid(stream: &UnixStream) -> u32 {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid out-pointers of the sizes SO_PEERCRED writes.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "SO_PEERCRED");
    cred.pid as u32
}

fn serve(
    mut stream: UnixStream,
    id: u64,
    behaviour: Behaviour,
    delay: Duration,
    stop: Arc<AtomicBool>,
    record: Arc<Record>,
) {
    let pid = peer_pid(&stream);
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let mut buffer = Vec::new();
    let mut answered = false;
    while !stop.load(Ordering::Relaxed) {
        loop {
            let message = match wire::decode_frame(&buffer) {
                Ok(Some((message, used))) => {
                    buffer.drain(..used);
                    message
                }
                Ok(None) => break,
                Err(e) => {
                    record.garbage.lock().unwrap().push(e.to_string());
                    return;
                }
            };
            match message {
                Message::CheckIn(_) => {
                    record.check_ins.fetch_add(1, Ordering::SeqCst);
                    record.check_in_pids.lock().unwrap().push(pid);
                    if !answered {
                        answered = true;
                        std::thread::sleep(delay);
                        let reply = match &behaviour {
                            Behaviour::Verdict(v) => {
                                Some(wire::encode_frame(&Message::Verdict(VerdictMsg {
                                    decision_id: id,
                                    ..v.clone()
                                })))
                            }
                            Behaviour::Silent => None,
                            Behaviour::Raw(bytes) => Some(bytes.clone()),
                        };
                        if let Some(reply) = reply {
                            let _ = stream.write_all(&reply);
                        }
                    }
                }
                Message::Outcome(o) => record.outcomes.lock().unwrap().push((pid, o)),
                _ => {}
            }
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// A command with no METALIFT_* or preload variables inherited from the test's
/// own environment.
pub fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    scrub(&mut cmd);
    cmd.stdin(Stdio::null());
    cmd
}

/// Removes from `cmd` the METALIFT_* and loader variables this process inherited.
pub fn scrub(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("METALIFT_") || key == "LD_PRELOAD" || key == "LD_LIBRARY_PATH" {
            cmd.env_remove(key);
        }
    }
}

/// The same command with libmetalift injected, asking `socket`.
pub fn injected(program: impl AsRef<std::ffi::OsStr>, socket: &Path) -> Command {
    let mut cmd = clean(program);
    cmd.env("LD_PRELOAD", shim()).env("METALIFT_SOCKET", socket);
    // Where the shim notes an unresponsive daemon (its private directory): the
    // socket's own temporary directory, so each test's markers are its own and
    // go away with it.
    if let Some(dir) = socket.parent() {
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
    // The longest deadline the shim allows: a loaded CI box must not turn an
    // answered check-in into a timeout. Tests of the deadline itself lower it.
    cmd.env("METALIFT_TIMEOUT_MS", "10000");
    cmd
}

/// Runs the command, feeding `stdin`, and returns its output (bounded wait).
pub fn run(mut cmd: Command, stdin: &[u8]) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let output = child.wait_with_output().expect("wait");
    let _ = writer.join();
    output
}

/// Whether this process runs as root. A test that needs root (to act as another
/// user, to chown) calls it: as another user it fails saying why, unless
/// `METALIFT_TEST_SKIP_ROOT=1` asks to skip it (CI runs as root, so there it
/// always runs).
pub fn root_or_skip(why: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        assert!(
            std::env::var_os("METALIFT_TEST_SKIP_ROOT").is_some_and(|v| v == "1"),
            "{why}: run as root, as CI does, or set METALIFT_TEST_SKIP_ROOT=1 to skip it"
        );
        eprintln!("SKIPPED: not root (METALIFT_TEST_SKIP_ROOT=1)");
    }
    root
}

/// Runs `cmd` (a probe with `--verify --json` or the like) and parses its JSON,
/// whatever its exit status: the output and the report.
pub fn run_json(cmd: Command) -> (Output, serde_json::Value) {
    let output = run(cmd, b"");
    let json = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, json)
}

/// Runs a probe (with `--json`) and parses what it printed.
pub fn probe_json(mut cmd: Command) -> serde_json::Value {
    cmd.arg("--json");
    let output = run(cmd, b"");
    assert!(
        output.status.success(),
        "probe failed: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "probe printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Asserts the probe saw the paravirtual device's own answers.
pub fn assert_stock(report: &serde_json::Value) {
    assert_eq!(report["apple_family"], 5, "{report}");
    assert_eq!(report["families"]["Apple6"], false, "{report}");
    assert_eq!(report["families"]["Apple7"], false, "{report}");
    assert_eq!(report["max_threadgroup_memory"], 32768, "{report}");
    for flag in ["has_simdgroup_reduction", "has_simdgroup_mm", "has_bfloat"] {
        assert_eq!(report["llama_cpp"][flag], false, "{flag}: {report}");
    }
}

/// Asserts the probe saw the apple7 profile applied, and nothing beyond Apple families.
pub fn assert_apple7(report: &serde_json::Value) {
    assert_eq!(report["apple_family"], 7, "{report}");
    assert_eq!(report["families"]["Apple8"], false, "{report}");
    assert_eq!(report["families"]["Metal3"], false, "{report}");
    assert_eq!(report["families"]["Metal4"], false, "{report}");
    assert_eq!(report["families"]["Common3"], true, "{report}");
    assert_eq!(report["families"]["Mac2"], true, "{report}");
    for flag in ["has_simdgroup_reduction", "has_simdgroup_mm", "has_bfloat"] {
        assert_eq!(report["llama_cpp"][flag], true, "{flag}: {report}");
    }
}
