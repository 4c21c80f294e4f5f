//! metaliftd end to end: the real binary on a temporary socket, spoken to in the
//! raw wire protocol by this process and by real child processes.
//!
//! Child processes are this test binary, hard-linked under other names and
//! re-executed with `--ignored --exact child_client`: the daemon then sees a
//! process whose executable path we chose, while what the child *claims* to be
//! is whatever the test says. Every wait has a generous hang guard; nothing
//! asserts on timing.
#![cfg(target_os = "linux")]

#[path = "record_schema.rs"]
mod record_schema;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{
    self, Answers, CheckIn, Message, Outcome, OutcomeResult, VerdictMsg, WireAction,
};
use serde_json::Value;

/// The longest any single step may take before the test calls it a hang.
const HANG_GUARD: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// An isolated directory laid out for the one scratch daemon ([`ScratchDir`]),
/// with `bin/` for the test's own executables.
struct Env {
    dir: tempfile::TempDir,
    scratch: ScratchDir,
}

impl std::ops::Deref for Env {
    type Target = ScratchDir;

    fn deref(&self) -> &ScratchDir {
        &self.scratch
    }
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("server-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let scratch = ScratchDir::new(dir.path()).expect("layout");
        Env { dir, scratch }
    }

    /// Writes `policy.toml` with one unlock rule for executables under `bin/llama-*`.
    fn write_llama_policy(&self) {
        self.write_policy(
            "enforce",
            &format!("path = \"{}/bin/llama-*\"", self.dir.path().display()),
        );
    }

    /// Writes `policy.toml` in `mode` with one unlock rule `llama` whose matcher is `matcher`.
    fn write_policy(&self, mode: &str, matcher: &str) {
        let text = format!(
            "version = 1\nmode = \"{mode}\"\n\n[profile.apple7]\napple_family_max = 7\nmax_threadgroup_memory = 32768\n\n\
             [[rule]]\nid = \"llama\"\n{matcher}\nunlock = \"apple7\"\n"
        );
        self.scratch.write_policy(&text).expect("write policy");
    }

    /// This test binary, hard-linked (same inode, new path) as `bin/<name>`.
    fn executable_named(&self, name: &str) -> PathBuf {
        let bin = self.path("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        let target = bin.join(name);
        let me = std::env::current_exe().expect("current exe");
        std::fs::hard_link(&me, &target).expect("hard link test binary");
        target
    }

    /// A private copy of this test binary as `bin/<name>` (its own inode).
    fn executable_copied(&self, name: &str) -> PathBuf {
        let bin = self.path("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        let target = bin.join(name);
        std::fs::copy(std::env::current_exe().expect("current exe"), &target)
            .expect("copy test binary");
        target
    }

    fn start(&self, extra: &[&str]) -> ScratchDaemon {
        self.scratch
            .start(
                Path::new(env!("CARGO_BIN_EXE_metaliftd")),
                extra,
                &[("RUST_LOG", "debug")],
            )
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every audit record, parsed and valid by the record schema.
    fn records(&self) -> Vec<Value> {
        record_schema::valid_records(&self.audit_log())
    }

    fn records_of(&self, kind: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }
}

/// The one client ([`wire::Client`]), failing the test on a transport error.
struct Client(wire::Client);

impl Client {
    fn connect(socket: &Path) -> Client {
        Client(wire::Client::connect(socket, HANG_GUARD).expect("connect"))
    }

    fn send(&mut self, msg: &Message) {
        self.0.send(msg).expect("send");
    }

    /// The next message, or `None` when the daemon closed the connection.
    fn recv(&mut self) -> Option<Message> {
        self.0.receive().expect("reading from metaliftd")
    }

    fn check_in(&mut self, claimed: Option<&str>) -> VerdictMsg {
        let check_in = CheckIn {
            shim_version: "test".into(),
            arch: std::env::consts::ARCH.into(),
            claimed_executable: claimed.map(str::to_owned),
            job: None,
        };
        self.0.check_in(&check_in).expect("a verdict")
    }

    /// True once the daemon has closed its end.
    fn closed_by_daemon(&mut self) -> bool {
        matches!(self.0.receive(), Ok(None))
    }
}

fn check_in_once(socket: &Path, claimed: Option<&str>) -> VerdictMsg {
    Client::connect(socket).check_in(claimed)
}

/// Runs `exe` (a hard link of this binary) as a child that checks in, claiming
/// `claimed`, and returns the verdict it printed.
fn verdict_of_child(exe: &Path, socket: &Path, claimed: &str) -> (u64, String, String) {
    let out = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "child_client",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("METALIFT_TEST_SOCKET", socket)
        .env("METALIFT_TEST_CLAIM", claimed)
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("VERDICT ").map(|(_, rest)| rest))
        .unwrap_or_else(|| {
            panic!(
                "child printed no verdict: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let mut parts = line.split(' ');
    let id = parts
        .next()
        .and_then(|p| p.parse().ok())
        .expect("decision id");
    let action = parts.next().expect("action").to_owned();
    let rule = parts.next().expect("rule").to_owned();
    (id, action, rule)
}

/// Whether the child's verdict said "would unlock" (monitor mode), from the same line.
fn would_unlock_of_child(exe: &Path, socket: &Path) -> (u64, String, bool) {
    let out = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "child_client",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("METALIFT_TEST_SOCKET", socket)
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.split_once("VERDICT ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("child printed no verdict: {stdout}"))
        .split(' ')
        .collect();
    (
        fields[0].parse().expect("decision id"),
        fields[1].to_owned(),
        fields[3] == "true",
    )
}

/// Not a test: the body of the child processes above (run with `--ignored --exact`).
#[test]
#[ignore = "child-process helper, run by other tests"]
fn child_client() {
    let socket = std::env::var_os("METALIFT_TEST_SOCKET").expect("METALIFT_TEST_SOCKET");
    let claim = std::env::var("METALIFT_TEST_CLAIM").ok();
    let v = check_in_once(Path::new(&socket), claim.as_deref());
    let action = match v.action {
        WireAction::Unlock => "unlock",
        WireAction::Stock => "stock",
    };
    println!(
        "VERDICT {} {action} {} {}",
        v.decision_id,
        v.rule.as_deref().unwrap_or("-"),
        v.would_unlock
    );
}

fn decision_with_id(env: &Env, id: u64) -> Value {
    env.records_of("decision")
        .into_iter()
        .find(|r| r["decision_id"] == id)
        .unwrap_or_else(|| panic!("no decision {id} in the audit log"))
}

// ---------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------

#[test]
fn a_child_process_gets_the_verdict_for_its_real_executable() {
    let env = Env::new();
    env.write_llama_policy();
    let llama = env.executable_named("llama-server");
    let other = env.executable_named("other-tool");
    let daemon = env.start(&[]);

    let (id, action, rule) = verdict_of_child(&llama, &env.socket(), "whatever");
    assert_eq!((action.as_str(), rule.as_str()), ("unlock", "llama"));
    let record = decision_with_id(&env, id);
    assert_eq!(record["exe"], llama.display().to_string());
    assert_eq!(record["action"], "unlock");
    assert_eq!(record["profile"], "apple7");

    // No rule reads the parent: it is neither read nor recorded (a check-in
    // reads only what the policy needs; `daemon_ops.rs` has the parent rule).
    assert!(record["parent_exe"].is_null(), "{record}");

    let (_, action, rule) = verdict_of_child(&other, &env.socket(), "whatever");
    assert_eq!((action.as_str(), rule.as_str()), ("stock", "-"));
    drop(daemon);
}

#[test]
fn a_sha256_rule_matches_the_running_file_and_hashes_it_once() {
    use sha2::Digest;
    let env = Env::new();
    // A copy, not a hard link: other tests hard-link this same binary, and each
    // new link changes the shared inode's ctime, which (rightly) voids a hash
    // computed meanwhile.
    let tool = env.executable_copied("renamed-tool");
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&tool).expect("read")));
    env.write_policy("enforce", &format!("sha256 = \"{digest}\""));
    let _daemon = env.start(&[]);

    for _ in 0..2 {
        let (id, action, rule) = verdict_of_child(&tool, &env.socket(), "x");
        assert_eq!((action.as_str(), rule.as_str()), ("unlock", "llama"));
        assert_eq!(decision_with_id(&env, id)["sha256"], digest);
    }
    let status =
        metalift_daemon::service::status::request(&env.socket(), HANG_GUARD).expect("status");
    assert_eq!(status.cache_entries, 1);
}

#[test]
fn in_monitor_mode_a_matching_rule_answers_stock_and_records_would_unlock() {
    let env = Env::new();
    env.write_policy(
        "monitor",
        &format!("path = \"{}/bin/llama-*\"", env.dir.path().display()),
    );
    let llama = env.executable_named("llama-server");
    let _daemon = env.start(&[]);

    let (id, action, would_unlock) = would_unlock_of_child(&llama, &env.socket());
    assert_eq!(action, "stock");
    assert!(would_unlock);
    let record = decision_with_id(&env, id);
    assert_eq!(record["action"], "stock");
    assert_eq!(record["mode"], "monitor");
    assert_eq!(record["would_unlock"], true);
    assert_eq!(record["profile"], "apple7");
}

#[test]
fn a_client_claiming_another_executable_gets_the_verdict_for_what_it_is() {
    let env = Env::new();
    env.write_llama_policy();
    let llama = env.executable_named("llama-server");
    let impostor = env.executable_named("impostor");
    let _daemon = env.start(&[]);

    let claim = llama.display().to_string();
    let (id, action, rule) = verdict_of_child(&impostor, &env.socket(), &claim);
    assert_eq!((action.as_str(), rule.as_str()), ("stock", "-"));

    let record = decision_with_id(&env, id);
    assert_eq!(record["exe"], impostor.display().to_string());
    assert_eq!(record["advisory"]["claimed_executable"], claim);
    assert!(record["rule"].is_null());
}

// ---------------------------------------------------------------------------
// Audit
// ---------------------------------------------------------------------------

#[test]
fn every_answered_check_in_has_exactly_one_decision_record() {
    let env = Env::new();
    env.write_llama_policy();
    let daemon = env.start(&[]);
    let socket = env.socket();
    let ids: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..10)
                        .map(|_| check_in_once(&socket, None).decision_id)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client thread"))
            .collect()
    });
    assert!(daemon.stop().expect("metaliftd stops").success());

    let decisions = env.records_of("decision");
    assert_eq!(decisions.len(), 40);
    let logged: HashSet<u64> = decisions
        .iter()
        .map(|r| r["decision_id"].as_u64().expect("id"))
        .collect();
    assert_eq!(logged, ids.iter().copied().collect::<HashSet<_>>());
    let stop = env.records_of("daemon_stop");
    assert_eq!(stop.len(), 1);
    assert_eq!(stop[0]["checkins"], 40);
    assert_eq!(stop[0]["reason"], "SIGTERM");
    assert_eq!(env.records_of("daemon_start").len(), 1);
}

#[test]
fn after_sigkill_mid_load_every_answered_decision_is_in_the_log() {
    let env = Env::new();
    env.write_llama_policy();
    let mut daemon = env.start(&[]);
    let socket = env.socket();
    let answered = Mutex::new(Vec::new());
    let count = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);

    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut client) = wire::Client::connect(&socket, HANG_GUARD) else {
                        break;
                    };
                    // The daemon may die between our connect and this write.
                    if client.send(&Message::CheckIn(CheckIn::default())).is_err() {
                        break;
                    }
                    match client.receive() {
                        Ok(Some(Message::Verdict(v))) => {
                            answered.lock().unwrap().push(v.decision_id);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => break,
                    }
                }
            });
        }
        let start = Instant::now();
        while count.load(Ordering::Relaxed) < 100 {
            assert!(start.elapsed() < HANG_GUARD, "load did not get going");
            std::thread::sleep(Duration::from_millis(5));
        }
        daemon.kill();
        stop.store(true, Ordering::Relaxed);
    });

    let answered = answered.into_inner().unwrap();
    assert!(answered.len() >= 100);
    let logged: HashSet<u64> = env
        .records_of("decision")
        .iter()
        .map(|r| r["decision_id"].as_u64().expect("id"))
        .collect();
    let missing: Vec<_> = answered.iter().filter(|id| !logged.contains(id)).collect();
    assert!(missing.is_empty(), "answered but not logged: {missing:?}");
}

#[test]
fn an_outcome_is_recorded_only_for_the_decision_given_on_that_connection() {
    let env = Env::new();
    env.write_llama_policy();
    let _daemon = env.start(&[]);

    let outcome = |decision_id| {
        Message::Outcome(Outcome {
            decision_id,
            result: OutcomeResult::Stock,
            reason: "verdict said stock".into(),
            device_class: "AppleParavirtDevice".into(),
            stock: Answers::default(),
            effective: Answers::default(),
            ..Default::default()
        })
    };
    let mut honest = Client::connect(&env.socket());
    let given = honest.check_in(None).decision_id;
    honest.send(&outcome(given));
    assert!(honest.closed_by_daemon());

    let mut forger = Client::connect(&env.socket());
    let own = forger.check_in(None).decision_id;
    forger.send(&outcome(own + 1_000_000));
    assert!(forger.closed_by_daemon());

    let outcomes = env.records_of("outcome");
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(outcomes[0]["decision_id"], given);
    assert_eq!(outcomes[0]["result"], "stock");
}

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------

#[test]
fn garbage_and_oversize_frames_close_only_their_own_connection() {
    let env = Env::new();
    env.write_llama_policy();
    let _daemon = env.start(&[]);

    let mut garbage = Client::connect(&env.socket());
    garbage
        .0
        .send_bytes(b"\x05\x00\x00\x00hello")
        .expect("write");
    let mut oversize = Client::connect(&env.socket());
    oversize
        .0
        .send_bytes(&(wire::MAX_FRAME as u32 + 1).to_le_bytes())
        .expect("write");
    let mut out_of_order = Client::connect(&env.socket());
    out_of_order.send(&Message::StatusRequest);
    assert!(matches!(out_of_order.recv(), Some(Message::Status(_))));

    assert!(garbage.closed_by_daemon());
    assert!(oversize.closed_by_daemon());
    let v = check_in_once(&env.socket(), None);
    assert_eq!(v.action, WireAction::Stock);
}

#[test]
fn a_slowloris_client_is_cut_at_the_read_deadline_and_others_are_served() {
    let env = Env::new();
    env.write_llama_policy();
    // One active place only: the honest client must wait for the slow one's deadline.
    let _daemon = env.start(&["--max-connections", "1", "--read-timeout-ms", "1000"]);

    let mut slow = Client::connect(&env.socket());
    let frame = wire::encode_frame(&Message::CheckIn(CheckIn::default()));
    slow.0.send_bytes(&frame[..3]).expect("partial frame");

    let v = check_in_once(&env.socket(), None);
    assert_eq!(v.action, WireAction::Stock);
    assert!(slow.closed_by_daemon(), "the slow client was not cut");
    // The slow client's bytes never became a check-in.
    assert_eq!(env.records_of("decision").len(), 1);
}

#[test]
fn shims_waiting_to_report_an_outcome_do_not_take_the_places_of_new_check_ins() {
    let env = Env::new();
    env.write_llama_policy();
    let _daemon = env.start(&["--max-connections", "1"]);

    // Each answered shim stays connected (it would report its outcome later).
    let mut idle: Vec<Client> = Vec::new();
    for _ in 0..5 {
        let mut c = Client::connect(&env.socket());
        c.check_in(None);
        idle.push(c);
    }
    let v = check_in_once(&env.socket(), None);
    assert_eq!(v.action, WireAction::Stock);
    assert_eq!(env.records_of("decision").len(), 6);

    // Status shows them waiting, and only itself active (the daemon moves each
    // connection just after answering it, so poll until it has).
    let start = Instant::now();
    loop {
        let status =
            metalift_daemon::service::status::request(&env.socket(), HANG_GUARD).expect("status");
        let counts = (status.connections_waiting, status.connections_active);
        if counts == (5, 1) {
            break;
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "(waiting, active) stuck at {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(idle);
}

// ---------------------------------------------------------------------------
// Socket lifecycle and status
// ---------------------------------------------------------------------------

#[test]
fn a_stale_socket_is_replaced_a_live_daemon_is_refused_and_sigterm_removes_the_socket() {
    let env = Env::new();
    env.write_llama_policy();
    std::fs::create_dir_all(env.socket().parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(env.socket()).expect("stale socket"));
    assert!(env.socket().exists());

    let daemon = env.start(&[]);
    let second = Command::new(env!("CARGO_BIN_EXE_metaliftd"))
        .arg("--policy")
        .arg(env.policy())
        .arg("--socket")
        .arg(env.socket())
        .arg("--audit-log")
        .arg(env.path("second.jsonl"))
        .arg("--allow-insecure-owner")
        .output()
        .expect("second daemon");
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("already listening"), "{stderr}");
    // The first daemon still serves.
    check_in_once(&env.socket(), None);

    assert!(daemon.stop().expect("metaliftd stops").success());
    assert!(!env.socket().exists(), "socket left behind");
}

// ---------------------------------------------------------------------------
// The core, in process: an unrecorded unlock is never given
// ---------------------------------------------------------------------------

#[test]
fn when_the_audit_log_refuses_the_decision_the_verdict_is_stock() {
    use metalift_daemon::audit::{AuditLog, Rotation};
    use metalift_daemon::checkin::server::Core;
    use metalift_daemon::live_policy::store::PolicyStore;

    let env = Env::new();
    let me = std::env::current_exe().expect("current exe");
    std::fs::write(
        env.policy(),
        format!(
            "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"me\"\npath = \"{}\"\nunlock = \"apple7\"\n",
            me.display()
        ),
    )
    .unwrap();
    let good_log = AuditLog::open(&env.audit_log(), Rotation::default()).expect("audit log");
    let opts = metalift_policy::LoadOptions {
        allow_insecure_owner: true,
    };
    let store =
        Arc::new(PolicyStore::load_initial(&env.policy(), opts, &good_log).expect("policy"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let facts = metalift_daemon::checkin::peer::facts_from_unix_stream(&a).expect("facts");

        let recorded = Core::new(Arc::clone(&store), Arc::new(good_log), 16);
        let v = recorded.check_in(&facts, CheckIn::default(), "unix").await;
        assert_eq!(v.action, WireAction::Unlock);
        assert_eq!(v.rule.as_deref(), Some("me"));

        // /dev/full: every write(2) fails with ENOSPC.
        let full =
            AuditLog::open(Path::new("/dev/full"), Rotation::default()).expect("open /dev/full");
        let unrecorded = Core::new(Arc::clone(&store), Arc::new(full), 16);
        let v = unrecorded
            .check_in(&facts, CheckIn::default(), "unix")
            .await;
        assert_eq!(v.action, WireAction::Stock);
        assert!(v.capabilities.is_none());
        assert_eq!(unrecorded.status().audit_failures, 1);
        assert_eq!(unrecorded.status().unlocks, 0);
    });
}

#[test]
fn status_names_a_refused_policy_by_location_without_quoting_it() {
    let env = Env::new();
    std::fs::write(env.policy(), "version = 1\nsecret_key = \"do not echo\"\n").unwrap();
    let _daemon = env.start(&[]);

    let status =
        metalift_daemon::service::status::request(&env.socket(), HANG_GUARD).expect("status");
    let error = status.last_reload_error.expect("the refusal is reported");
    assert!(error.contains("policy.toml:2:1: error:"), "{error}");
    assert!(!error.contains("do not echo"), "{error}");
    // Refused at start: no rules, everything stock.
    assert_eq!(status.rule_count, 0);
    assert_eq!(check_in_once(&env.socket(), None).action, WireAction::Stock);
}
