//! One user cannot starve the others (issue "libmetalift v5", item 6): a uid
//! flooding the daemon with check-ins whose identification is slow (standing
//! in for hash work on a large, re-touched executable, or a slow `SecCode`)
//! and then holding them idle never makes another uid's check-in late or
//! costs it its outcome.
//!
//! The flood runs as uid 65534 in a child process (this test binary again,
//! with `setuid` through `Command::uid`); the tests run as root, the other
//! user. Without root the test fails, saying so.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::checkin::peer::{IdentifyPeer, KernelIdentity, PeerError, PeerFacts, Wants};
use metalift_daemon::checkin::server::Core;
use metalift_daemon::checkin::transport::{unix, Limits};
use metalift_daemon::live_policy::store::PolicyStore;
use metalift_policy::wire::{Answers, CheckIn, Client, Message, Outcome, OutcomeResult};
use metalift_policy::LoadOptions;

const POLICY: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n";
/// The flooding user.
const FLOODER: u32 = 65534;
/// How long each of the flooder's identifications takes.
const SLOW: Duration = Duration::from_secs(2);
/// The flooder's check-ins: as many as every active and waiting place.
const FLOOD: usize = 8;
const FLOOD_ENV: &str = "METALIFT_TEST_FLOOD_SOCKET";
/// The door flooder's socket (the second test's child).
const SILENT_ENV: &str = "METALIFT_TEST_SILENT_SOCKET";
/// The door flooder's connections: as many as every pending place.
const SILENT: usize = 4096;

/// The kernel's identity, slow for the flooder's uid.
#[derive(Debug, Default)]
struct SlowForFlooder {
    flooder_started: AtomicUsize,
}

impl IdentifyPeer for SlowForFlooder {
    fn identify(&self, socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError> {
        let facts = KernelIdentity.identify(socket, wants)?;
        if facts.uid == FLOODER {
            self.flooder_started.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(SLOW);
        }
        Ok(facts)
    }
}

/// Reads one message; `None` when the daemon closed the connection first.
fn recv(client: &mut Client) -> Option<Message> {
    client.receive().expect("reading")
}

fn check_in(path: &Path) -> Client {
    let mut c = Client::connect(path, Duration::from_secs(30)).expect("connect");
    c.send(&Message::CheckIn(CheckIn::default())).expect("send");
    c
}

/// The child's part: FLOOD check-ins, told "sent"; then every answer read and
/// the connections held idle, told "idle"; then held until stdin closes.
fn flood(socket: &Path) {
    let mut conns: Vec<Client> = (0..FLOOD).map(|_| check_in(socket)).collect();
    println!("sent");
    for c in &mut conns {
        let _ = recv(c); // a verdict, or declined as busy
    }
    println!("idle");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// The door flooder's part: SILENT connections that never send a byte, told
/// "held" once all are made (the daemon keeps the uid's share, the newest);
/// then held until stdin closes.
fn hold_silent(socket: &Path) {
    let conns: Vec<std::os::unix::net::UnixStream> = (0..SILENT)
        .map(|_| std::os::unix::net::UnixStream::connect(socket).expect("connect"))
        .collect();
    println!("held");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(conns);
}

/// Runs this test binary's test `name` again as the flooder, with `env` set to
/// `socket`; its stdout piped.
fn spawn_flooder(dir: &Path, name: &str, env: &str, socket: &Path) -> std::process::Child {
    // This test binary, readable by the flooder, run as the flooder.
    let exe = dir.join("flooder");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    // ETXTBSY: another test thread forking while the copy's write descriptor
    // was open holds it until that child execs; the copy is whole, so wait.
    let mut tries = 0;
    loop {
        match Command::new(&exe)
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(env, socket)
            .uid(FLOODER)
            .gid(FLOODER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other.expect("the flooder"),
        }
    }
}

/// Waits for a line of the child's stdout ending in `word`.
fn wait_for(child: &mut std::process::Child, word: &str) {
    let mut out = BufReader::new(child.stdout.as_mut().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("the flooder's output") > 0,
            "the flooder ended before saying {word:?}"
        );
        if line.trim().ends_with(word) {
            return;
        }
    }
}

fn core(dir: &Path) -> Arc<Core> {
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY).expect("policy");
    let audit = Arc::new(AuditLog::open(&dir.join("audit.jsonl"), Rotation::default()).unwrap());
    let opts = LoadOptions {
        allow_insecure_owner: true,
    };
    let store = PolicyStore::load_initial(&policy, opts, &audit).expect("policy loads");
    Arc::new(Core::new(Arc::new(store), audit, 16))
}

/// A check-in by this process (root): its latency, and whether its outcome
/// was recorded (it had a waiting place).
fn victim(socket: &Path, audit: &Path) -> (Duration, bool) {
    let start = Instant::now();
    let mut s = check_in(socket);
    let Some(Message::Verdict(v)) = recv(&mut s) else {
        panic!("the other user's check-in was not answered with a verdict");
    };
    let took = start.elapsed();
    // Without a waiting place the daemon has closed already: the write may fail.
    let _ = s.outcome(&Outcome {
        decision_id: v.decision_id,
        result: OutcomeResult::Stock,
        reason: "victim".into(),
        device_class: "AppleParavirtDevice".into(),
        stock: Answers::default(),
        effective: Answers::default(),
        ..Default::default()
    });
    // The daemon closes once it has the outcome (or at once, without a place).
    let _ = recv(&mut s);
    let needle = format!("\"decision_id\":{}", v.decision_id);
    let recorded = std::fs::read_to_string(audit)
        .unwrap()
        .lines()
        .any(|l| l.contains("\"kind\":\"outcome\"") && l.contains(&needle));
    (took, recorded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_one_uid_flooding_slow_and_idle_check_ins_then_another_uid_is_answered_promptly_with_its_outcome(
) {
    if let Some(socket) = std::env::var_os(FLOOD_ENV) {
        flood(Path::new(&socket));
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "this test drops to uid {FLOODER} in a child: run it as root"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("metalift.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let identity = Arc::new(SlowForFlooder::default());
    let limits = Limits {
        max_active: FLOOD,
        max_waiting: FLOOD,
        ..Limits::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(unix::run_with_identity(
        listener,
        core(dir.path()),
        limits,
        Arc::clone(&identity) as Arc<dyn IdentifyPeer>,
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut child = spawn_flooder(
        dir.path(),
        "given_one_uid_flooding_slow_and_idle_check_ins_then_another_uid_is_answered_promptly_with_its_outcome",
        FLOOD_ENV,
        &socket,
    );
    let audit = dir.path().join("audit.jsonl");
    let (path, id) = (socket.clone(), Arc::clone(&identity));
    let outcome = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut wait_for = |word: &str| loop {
            let line = lines.next().expect("the flooder's output").unwrap();
            if line.trim().ends_with(word) {
                break;
            }
        };
        wait_for("sent");
        // The flooder's slow identifications are running.
        while id.flooder_started.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(100));
        let during_work = victim(&path, &audit);
        wait_for("idle");
        let during_idle = victim(&path, &audit);
        drop(child.stdin.take());
        let _ = child.wait();
        (during_work, during_idle)
    })
    .await
    .expect("clients");
    let _ = stop_tx.send(());
    server.await.expect("server stops");

    let ((work_took, work_recorded), (idle_took, idle_recorded)) = outcome;
    assert!(
        work_took < SLOW / 2,
        "answered in {work_took:?} while the other uid's identifications ran"
    );
    assert!(
        work_recorded,
        "its outcome was lost during the other uid's work"
    );
    assert!(
        idle_took < SLOW / 2,
        "answered in {idle_took:?} while the other uid held idle check-ins"
    );
    assert!(
        idle_recorded,
        "its outcome was lost: the other uid held every waiting place"
    );
}

/// Issue 42 item 4: one uid holding 4096 silent connections (as many as every
/// pending place) never stops the daemon accepting another uid: each of its
/// connections past its share takes the place of its own oldest (closed), and
/// the other uid's
/// check-in is answered at once. Red with one global pool of pending places
/// (the accept loop then waits until a silent connection's first-frame
/// deadline, 10 s here, passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_one_uid_holding_4096_silent_connections_then_another_uids_check_in_is_answered_in_time(
) {
    if let Some(socket) = std::env::var_os(SILENT_ENV) {
        hold_silent(Path::new(&socket));
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "this test drops to uid {FLOODER} in a child: run it as root"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("metalift.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let limits = Limits {
        max_pending: SILENT,
        first_frame_timeout: Duration::from_secs(10),
        read_timeout: Duration::from_secs(10),
        ..Limits::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(unix::run(listener, core(dir.path()), limits, async {
        let _ = stop_rx.await;
    }));
    let mut child = spawn_flooder(
        dir.path(),
        "given_one_uid_holding_4096_silent_connections_then_another_uids_check_in_is_answered_in_time",
        SILENT_ENV,
        &socket,
    );
    let audit = dir.path().join("audit.jsonl");
    let path = socket.clone();
    let (took, recorded) = tokio::task::spawn_blocking(move || {
        wait_for(&mut child, "held");
        let answered = victim(&path, &audit);
        drop(child.stdin.take());
        let _ = child.wait();
        answered
    })
    .await
    .expect("clients");
    let _ = stop_tx.send(());
    server.await.expect("server stops");
    // The shim's default deadline is 2 s.
    assert!(
        took < Duration::from_secs(1),
        "answered in {took:?} while another uid held 4096 silent connections"
    );
    assert!(recorded, "its outcome was recorded");
}
