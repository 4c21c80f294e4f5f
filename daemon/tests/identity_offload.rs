//! Identifying a peer blocks (`/proc`, `SecCode`, hashing). The Unix-socket
//! transport runs it on the core's bounded blocking pool, so one slow
//! identification stalls neither the accept loop, nor the deadlines, nor any
//! other client: shown here with an identity seam that blocks its thread for 2 s
//! on a single-threaded runtime (the case of every worker being busy).
//!
//! "Promptly" is judged against the slow identification itself, not against a
//! clock: each of the other exchanges must be over before the slow one returns.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::checkin::peer::{IdentifyPeer, KernelIdentity, PeerError, PeerFacts, Wants};
use metalift_daemon::checkin::server::Core;
use metalift_daemon::checkin::transport::{unix, Limits};
use metalift_daemon::live_policy::store::PolicyStore;
use metalift_policy::wire::{CheckIn, Client, Message};
use metalift_policy::LoadOptions;

const POLICY: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n";
const SLOW: Duration = Duration::from_secs(2);

/// The kernel's identity, except that the first identification blocks its
/// thread for [`SLOW`], as a `SecCode` check on a cold disk can.
#[derive(Debug, Default)]
struct SlowFirst {
    started: AtomicBool,
    finished: AtomicBool,
    /// What had already happened when the slow identification returned.
    seen_when_finished: Mutex<Vec<&'static str>>,
    events: Mutex<Vec<&'static str>>,
}

impl SlowFirst {
    fn note(&self, event: &'static str) {
        self.events.lock().unwrap().push(event);
    }
}

impl IdentifyPeer for SlowFirst {
    fn identify(&self, socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError> {
        if !self.started.swap(true, Ordering::SeqCst) {
            std::thread::sleep(SLOW);
            *self.seen_when_finished.lock().unwrap() = self.events.lock().unwrap().clone();
            self.finished.store(true, Ordering::SeqCst);
        }
        KernelIdentity.identify(socket, wants)
    }
}

/// Sends one message through the one client.
fn send(client: &mut Client, msg: &Message) {
    client.send(msg).expect("send");
}

/// One message, or `None` when the daemon closed first (an end of file or a
/// reset: `wire::Client` reports both as closed).
fn recv(client: &mut Client) -> Option<Message> {
    client.receive().expect("reading")
}

fn connect(path: &Path) -> Client {
    Client::connect(path, Duration::from_secs(30)).expect("connect")
}

fn check_in(path: &Path) -> Client {
    let mut c = connect(path);
    send(&mut c, &Message::CheckIn(CheckIn::default()));
    c
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

#[tokio::test(flavor = "current_thread")]
async fn given_a_slow_identification_then_other_clients_the_accept_loop_and_timers_go_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("metalift.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let identity = Arc::new(SlowFirst::default());
    let limits = Limits {
        first_frame_timeout: Duration::from_millis(200),
        read_timeout: Duration::from_millis(200),
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

    // The clients are plain threads: they see the daemon as a shim would.
    let (path, id) = (socket.clone(), Arc::clone(&identity));
    let clients = tokio::task::spawn_blocking(move || {
        // A: its identification takes SLOW.
        let mut slow = check_in(&path);
        while !id.started.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }

        // B: another shim's check-in is answered meanwhile.
        let mut other = check_in(&path);
        assert!(matches!(recv(&mut other), Some(Message::Verdict(_))));
        id.note("other check-in answered");

        // A status request is accepted and answered meanwhile.
        let mut status = connect(&path);
        send(&mut status, &Message::StatusRequest);
        assert!(matches!(recv(&mut status), Some(Message::Status(_))));
        id.note("status answered");

        // A client that says nothing is cut at the first-frame deadline: the
        // timer fires meanwhile.
        let mut silent = connect(&path);
        assert!(recv(&mut silent).is_none(), "closed unanswered");
        id.note("silent client timed out");

        // And A is answered in the end.
        assert!(matches!(recv(&mut slow), Some(Message::Verdict(_))));
    });
    clients.await.expect("clients");
    let _ = stop_tx.send(());
    server.await.expect("server stops");

    assert!(identity.finished.load(Ordering::SeqCst));
    assert_eq!(
        *identity.seen_when_finished.lock().unwrap(),
        [
            "other check-in answered",
            "status answered",
            "silent client timed out"
        ],
        "everything else happened while the slow identification ran"
    );
}
