//! Refusals on the Unix socket, through the real transport and core (issue 24
//! items 1 and 2): each is an audit record of its own kind (`refused`), and
//! nothing the refused message claimed reaches a decision or an outcome record.
//!
//! The macOS socket identity is only type-checked here; its refusal is the pure
//! `peer::socket_uid`, fed by a stand-in identity whose audit-token euid differs
//! from the uid `LOCAL_PEERCRED` recorded at connect (a setuid program that
//! touched the socket after a user connected it).

#[path = "record_schema.rs"]
mod record_schema;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::checkin::peer::{
    self, IdentifyPeer, KernelIdentity, PeerError, PeerFacts, Wants,
};
use metalift_daemon::checkin::server::Core;
use metalift_daemon::checkin::transport::{unix, Limits};
use metalift_daemon::live_policy::store::PolicyStore;
use metalift_policy::wire::{Answers, CheckIn, Client, Message, Outcome, OutcomeResult};
use metalift_policy::LoadOptions;
use serde_json::Value;

const POLICY: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n";

/// The kernel's identity, as macOS would see a socket whose last user runs with
/// another effective uid than the one that connected: `connect_uid` from
/// `LOCAL_PEERCRED`, the token's euid one more.
#[derive(Debug)]
struct TokenEuidDiffers;

impl IdentifyPeer for TokenEuidDiffers {
    fn identify(&self, socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError> {
        let facts = KernelIdentity.identify(socket, wants)?;
        let connect_uid = 501;
        let uid = peer::socket_uid(facts.pid, connect_uid, 0)?;
        Ok(PeerFacts { uid, ..facts })
    }
}

struct Server {
    dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn start(identity: Arc<dyn IdentifyPeer>) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let policy = dir.path().join("policy.toml");
        std::fs::write(&policy, POLICY).expect("policy");
        let audit =
            Arc::new(AuditLog::open(&dir.path().join("audit.jsonl"), Rotation::default()).unwrap());
        let opts = LoadOptions {
            allow_insecure_owner: true,
        };
        let store = PolicyStore::load_initial(&policy, opts, &audit).expect("policy loads");
        let core = Arc::new(Core::new(Arc::new(store), audit, 16));
        let listener =
            tokio::net::UnixListener::bind(dir.path().join("metalift.sock")).expect("bind");
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(unix::run_with_identity(
            listener,
            core,
            Limits::default(),
            identity,
            async {
                let _ = stop_rx.await;
            },
        ));
        Server { dir, stop, task }
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("metalift.sock")
    }

    fn records(&self, kind: &str) -> Vec<Value> {
        record_schema::valid_records(&self.dir.path().join("audit.jsonl"))
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }

    async fn stop(self) -> tempfile::TempDir {
        let _ = self.stop.send(());
        self.task.await.expect("server stops");
        self.dir
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

fn outcome(decision_id: u64) -> Message {
    Message::Outcome(Outcome {
        decision_id,
        result: OutcomeResult::Applied,
        reason: String::new(),
        device_class: "AppleParavirtDevice".into(),
        stock: Answers::default(),
        effective: Answers::default(),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_socket_whose_token_euid_differs_from_its_connect_uid_then_the_check_in_is_refused_and_recorded(
) {
    let server = Server::start(Arc::new(TokenEuidDiffers));
    let path = server.socket();
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = connect(&path);
        send(&mut s, &Message::CheckIn(CheckIn::default()));
        recv(&mut s)
    })
    .await
    .unwrap();
    assert!(answer.is_none(), "closed unanswered (the shim stays stock)");
    let dir = server.stop().await;
    let server_records = |kind: &str| -> Vec<Value> {
        record_schema::valid_records(&dir.path().join("audit.jsonl"))
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    };
    assert!(
        server_records("decision").is_empty(),
        "nothing decided as root"
    );
    let refused = server_records("refused");
    assert_eq!(refused.len(), 1, "{refused:#?}");
    let r = &refused[0];
    assert_eq!(r["message"], "check_in");
    assert_eq!(r["reason"], "uid_changed");
    assert_eq!(r["uid"], 501, "the uid fixed at connect");
    assert_eq!(r["pid"], std::process::id());
    assert_eq!(r["transport"], "unix");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains("uid 0") && detail.contains("uid 501"),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_an_outcome_for_another_decision_or_without_a_check_in_then_each_is_a_refused_record()
{
    let server = Server::start(Arc::new(KernelIdentity));
    let path = server.socket();
    let given = tokio::task::spawn_blocking(move || {
        let mut s = connect(&path);
        send(&mut s, &Message::CheckIn(CheckIn::default()));
        let Some(Message::Verdict(v)) = recv(&mut s) else {
            panic!("a verdict")
        };
        send(&mut s, &outcome(v.decision_id + 1));
        assert!(recv(&mut s).is_none());

        let mut alone = connect(&path);
        send(&mut alone, &outcome(v.decision_id));
        assert!(recv(&mut alone).is_none());
        v.decision_id
    })
    .await
    .unwrap();
    // Both refusals are written before their connections close.
    let (outcomes, refused) = (server.records("outcome"), server.records("refused"));
    server.stop().await;
    assert!(outcomes.is_empty(), "{outcomes:#?}");
    let seen: Vec<_> = refused
        .iter()
        .map(|r| (r["reason"].clone(), r["decision_id"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (Value::from("wrong_decision"), Value::from(given)),
            (Value::from("unexpected"), Value::Null),
        ],
        "{refused:#?}"
    );
    assert_eq!(refused[0]["pid"], std::process::id());
    assert!(refused[0]["exe"].as_str().is_some_and(|e| !e.is_empty()));
}
