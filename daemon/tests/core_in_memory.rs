//! The server core driven through the daemon's own XPC exchange over an
//! in-memory link, on any OS: the proof that the XPC path decides and audits
//! nothing on its own.
//!
//! What an XPC peer goes through is one function, `xpc_peer::serve` (its steps
//! `checkin::session`'s, which the Unix socket calls too); the real transport
//! runs it over libxpc (`daemon/src/checkin/transport/xpc/peer_task.rs`), these
//! tests over [`stand_in::Memory`]. The stand-in is therefore no copy of the
//! peer task: it only moves frame bodies, the data value a real message
//! dictionary carries (`metalift_xpc::frame`), with "the kernel's" identity
//! beside each message (never in the frame). Neither link is given the session:
//! the steps, the waits and the identification's place on the core's blocking
//! pool are `serve`'s, so these tests cover them for the libxpc link too.
//! Whatever differs between a shim that asks over XPC and one that
//! asks over the socket is therefore only the libxpc calls and how the kernel
//! identity is read (`checkin/peer/macos.rs`), listed as type-checked only in
//! `daemon/src/macos/mod.rs`.

#[path = "record_schema.rs"]
mod record_schema;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::checkin::peer::{CodeSignature, PeerFacts};
use metalift_daemon::checkin::server::Core;
use metalift_daemon::checkin::session::{Places, Session};
use metalift_daemon::checkin::transport::door::{Door, Refused};
use metalift_daemon::checkin::transport::xpc_peer::{self, PeerError, PEER_QUEUE};
use metalift_daemon::checkin::transport::Limits;
use metalift_daemon::live_policy::store::PolicyStore;
use metalift_policy::wire::{
    Answers, CheckIn, DeclineReason, Declined, Message, Outcome, OutcomeResult, VerdictMsg,
    WireAction, WireError,
};
use metalift_policy::{Anchor, LoadOptions};
use serde_json::Value;

use metalift_xpc::exchange::{Refusal, Sender, Serving};
use metalift_xpc::frame::{self, Received};
use tokio::sync::mpsc;

/// The transport name the XPC transport records.
const XPC: &str = "xpc";

const POLICY: &str = r#"version = 1

[profile.apple7]
apple_family_max = 7
max_threadgroup_memory = 32768

[[rule]]
id = "llama"
path = "/opt/llama.cpp/bin/llama-*"
unlock = "apple7"

[[rule]]
id = "signed-by-us"
team_id = "ABCDE12345"
signing_id = "com.example.runner"
unlock = "apple7"
"#;

// ---------------------------------------------------------------------------
// The in-memory XPC
// ---------------------------------------------------------------------------

/// What a message dictionary carries: the frame body, as one data value.
type Frame = Vec<u8>;

fn to_frame(msg: &Message) -> Frame {
    frame::encode(msg)
}

/// The shim's reading of a reply's frame.
fn decode(body: &[u8]) -> Result<Message, WireError> {
    match frame::decode(Some(body), false) {
        Received::Message(message) => message,
        Received::OlderShim => unreachable!("a frame is never an older shim's dictionary"),
    }
}

/// What the kernel attaches to a message (the audit token, and what `SecCode`
/// says about the code it names). Never part of the dictionary.
#[derive(Debug, Clone)]
struct Kernel {
    pid: u32,
    pid_version: u32,
    euid: u32,
    exe: PathBuf,
    signature: Option<CodeSignature>,
    /// Makes reading the facts slow, as `SecCode` can be: they meet the test at
    /// this barrier when they start and again before they return.
    gate: Option<Arc<std::sync::Barrier>>,
}

impl Kernel {
    fn process(exe: &str) -> Kernel {
        Kernel {
            pid: 4242,
            pid_version: 7,
            euid: 501,
            exe: PathBuf::from(exe),
            signature: None,
            gate: None,
        }
    }

    /// The sender as the exchange sees it (the audit token's pid and version).
    fn sender(&self) -> Sender {
        Sender {
            pid: self.pid,
            pid_version: self.pid_version,
        }
    }

    /// The stand-in for `peer::facts_from_audit_token`.
    fn facts(&self) -> PeerFacts {
        if let Some(gate) = &self.gate {
            gate.wait();
            gate.wait();
        }
        PeerFacts {
            pid: self.pid,
            pid_version: Some(u64::from(self.pid_version)),
            uid: self.euid,
            exe: self.exe.clone(),
            parent_exe: None,
            ancestors: Vec::new(),
            code_signature: self.signature.clone(),
            exe_file: None,
            unreadable: None,
            hashes_withheld: None,
        }
    }
}

/// One peer connection, served by the daemon's own XPC exchange
/// (`xpc_peer::serve`, the function `checkin/transport/xpc/peer_task.rs` runs)
/// over [`Memory`], an in-memory link in place of libxpc. The test holds the
/// other end: it sends dictionaries with "the kernel's" identity and reads the
/// replies.
struct Peer {
    /// Messages to the exchange, each with the kernel's stamp (`None`: none).
    to_exchange: Option<mpsc::Sender<(Frame, Option<Kernel>)>>,
    /// The exchange's replies.
    replies: mpsc::UnboundedReceiver<Frame>,
    /// The exchange itself, and whether it has ended.
    exchange: tokio::task::JoinHandle<Result<(), PeerError>>,
    ended: Option<Result<(), Refusal>>,
}

impl Peer {
    fn new(core: &Arc<Core>) -> Peer {
        Peer::on(core, Serving::Identities, &Places::new(64, 1024))
    }

    /// A peer of a transport that decides as `serving` says, within `places`
    /// (shared by every peer given them, as the transport's are), at a door of
    /// its own.
    fn on(core: &Arc<Core>, serving: Serving, places: &Places) -> Peer {
        let door = Door::new(&Limits::default());
        Peer::connect(core, serving, places, &door, 501).expect("an empty door")
    }

    /// A peer of `euid` connecting: it takes its place at `door` first, as the
    /// libxpc listener does (`xpc/mod.rs` `accept`); refused, it is cancelled
    /// (the shim falls back to the socket).
    fn connect(
        core: &Arc<Core>,
        serving: Serving,
        places: &Places,
        door: &Door,
        euid: u32,
    ) -> Result<Peer, Refused> {
        let pending = door.enter(euid)?;
        let session = Session::new(Arc::clone(core), places.clone(), XPC);
        let (to_exchange, inbox) = mpsc::channel(PEER_QUEUE);
        let (outbox, replies) = mpsc::unbounded_channel();
        let exchange = tokio::spawn(async move {
            let mut link = stand_in::Memory { inbox, outbox };
            xpc_peer::serve(&session, serving, Limits::default(), &mut link, pending).await
        });
        Ok(Peer {
            to_exchange: Some(to_exchange),
            replies,
            exchange,
            ended: None,
        })
    }

    /// Delivers one message with the kernel's identity; returns the reply, if any.
    async fn deliver(
        &mut self,
        message: &Frame,
        kernel: &Kernel,
    ) -> Result<Option<Frame>, Refusal> {
        self.deliver_stamped(message, Some(kernel)).await
    }

    /// Delivers one message, with the kernel's per-message identity or (`None`)
    /// without one. Returns its reply, or how the exchange ended without one.
    async fn deliver_stamped(
        &mut self,
        message: &Frame,
        kernel: Option<&Kernel>,
    ) -> Result<Option<Frame>, Refusal> {
        let to = self.to_exchange.as_ref().expect("the peer is open");
        to.send((message.clone(), kernel.cloned()))
            .await
            .expect("the exchange is still reading");
        tokio::select! {
            biased;
            Some(reply) = self.replies.recv() => Ok(Some(reply)),
            end = &mut self.exchange, if self.ended.is_none() => {
                let end = Peer::refusal(end);
                self.ended = Some(end.clone());
                end.map(|()| None)
            }
        }
    }

    /// Closes the peer's side (the shim cancels its connection) and returns how
    /// the exchange ended.
    async fn close(mut self) -> Result<(), Refusal> {
        drop(self.to_exchange.take());
        match self.ended.take() {
            Some(end) => end,
            None => Peer::refusal((&mut self.exchange).await),
        }
    }

    fn refusal(end: Result<Result<(), PeerError>, tokio::task::JoinError>) -> Result<(), Refusal> {
        match end.expect("the exchange does not panic") {
            Ok(()) => Ok(()),
            Err(PeerError::Refused(refusal)) => Err(refusal),
            Err(other) => panic!("the exchange ended with {other}"),
        }
    }
}

/// The stand-in for libxpc: only a link, like `peer_task.rs`'s `Libxpc`. What
/// happens to a message is `xpc_peer::serve`'s and `session`'s, never this
/// module's: a [`PeerLink`] is never given the session.
mod stand_in {
    use metalift_daemon::checkin::peer::{self, PeerFacts};
    use metalift_daemon::checkin::transport::xpc_peer::{Event, PeerLink, Stamp};
    use metalift_policy::wire::Message;
    use metalift_xpc::frame::{self, Received};
    use tokio::sync::mpsc;

    use super::{to_frame, Frame, Kernel};

    /// The test's end of one peer connection.
    pub(super) struct Memory {
        /// What the peer sends, each with the kernel's stamp (libxpc's event
        /// handler forwards messages the same way, `PEER_QUEUE` deep).
        pub(super) inbox: mpsc::Receiver<(Frame, Option<Kernel>)>,
        /// What the daemon answers.
        pub(super) outbox: mpsc::UnboundedSender<Frame>,
    }

    impl PeerLink for Memory {
        type Token = Kernel;
        /// Every request the shim sends carries a reply handler.
        type Reply = ();

        fn stamp(token: &Kernel) -> Stamp {
            Stamp {
                sender: token.sender(),
                uid: token.euid,
            }
        }

        async fn next(&mut self) -> Event<Kernel, ()> {
            match self.inbox.recv().await {
                None => Event::Closed,
                Some((body, token)) => match frame::decode(Some(&body), false) {
                    Received::Message(message) => Event::Message {
                        message,
                        token,
                        reply: Some(()),
                    },
                    Received::OlderShim => Event::Closed,
                },
            }
        }

        fn reply(&mut self, (): (), message: &Message) {
            let _ = self.outbox.send(to_frame(message));
        }

        /// "The kernel's" facts, where the real link runs `facts_from_audit_token`.
        fn identify(token: Kernel) -> Result<PeerFacts, peer::PeerError> {
            Ok(token.facts())
        }

        async fn closed(&mut self) {
            while self.inbox.recv().await.is_some() {}
        }
    }
}

/// The shim's side: what it sends and how it reads the reply.
fn check_in_claiming(claimed: Option<&str>) -> Frame {
    to_frame(&Message::CheckIn(CheckIn {
        shim_version: "0.1.0".into(),
        arch: "arm64e".into(),
        claimed_executable: claimed.map(str::to_owned),
        job: None,
    }))
}

fn read_verdict(reply: Option<Frame>) -> VerdictMsg {
    match decode(&reply.expect("a check-in is answered")) {
        Ok(Message::Verdict(v)) => v,
        other => panic!("expected a verdict, got {other:?}"),
    }
}

fn outcome(decision_id: u64) -> Frame {
    to_frame(&outcome_message(decision_id))
}

fn outcome_message(decision_id: u64) -> Message {
    Message::Outcome(Outcome {
        decision_id,
        result: OutcomeResult::Applied,
        reason: String::new(),
        device_class: "AppleParavirtDevice".into(),
        stock: Answers {
            families: 0b1_1111,
            threadgroup_memory: 32768,
            working_set: 0,
        },
        effective: Answers {
            families: 0b111_1111,
            threadgroup_memory: 32768,
            working_set: 0,
        },
        ..Default::default()
    })
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

struct Daemon {
    _dir: tempfile::TempDir,
    audit_path: PathBuf,
    core: Arc<Core>,
}

impl Daemon {
    fn start() -> Daemon {
        Daemon::start_with(POLICY)
    }

    fn start_with(text: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let policy = dir.path().join("policy.toml");
        std::fs::write(&policy, text).expect("write policy");
        let audit_path = dir.path().join("audit.jsonl");
        let audit = Arc::new(AuditLog::open(&audit_path, Rotation::default()).expect("audit log"));
        let opts = LoadOptions {
            allow_insecure_owner: true,
        };
        let store = PolicyStore::load_initial(&policy, opts, &audit).expect("policy loads");
        let core = Arc::new(Core::new(Arc::new(store), audit, 16));
        Daemon {
            _dir: dir,
            audit_path,
            core,
        }
    }

    fn records(&self, kind: &str) -> Vec<Value> {
        records(&self.audit_path)
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(record_schema::valid_record)
        .collect()
}

/// A verdict without its decision id (ids differ between two decisions).
fn without_id(v: &VerdictMsg) -> VerdictMsg {
    VerdictMsg {
        decision_id: 0,
        ..v.clone()
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn given_a_matching_executable_then_the_xpc_reply_is_exactly_the_cores_verdict() {
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-server");

    let mut peer = Peer::new(&d.core);
    let via_xpc = read_verdict(
        peer.deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    let direct = d
        .core
        .check_in(&kernel.facts(), CheckIn::default(), XPC)
        .await;

    assert_eq!(via_xpc.action, WireAction::Unlock);
    assert_eq!(via_xpc.rule.as_deref(), Some("llama"));
    assert_eq!(via_xpc.capabilities.map(|c| c.apple_family_max), Some(7));
    assert_eq!(
        without_id(&via_xpc),
        without_id(&direct),
        "the transport adds nothing"
    );

    let decisions = d.records("decision");
    assert_eq!(
        decisions.len(),
        2,
        "one record per decision, written by the core"
    );
    let first = &decisions[0];
    assert_eq!(first["decision_id"], via_xpc.decision_id);
    assert_eq!(first["transport"], "xpc");
    assert_eq!(first["exe"], "/opt/llama.cpp/bin/llama-server");
    assert_eq!(first["pid"], 4242);
    assert_eq!(first["action"], "unlock");
}

#[tokio::test]
async fn given_a_claim_to_be_llama_then_the_kernels_identity_decides_and_the_claim_is_advisory() {
    let d = Daemon::start();
    let kernel = Kernel::process("/usr/bin/true");

    let mut peer = Peer::new(&d.core);
    let claim = check_in_claiming(Some("/opt/llama.cpp/bin/llama-server"));
    let verdict = read_verdict(peer.deliver(&claim, &kernel).await.unwrap());

    assert_eq!(verdict.action, WireAction::Stock);
    assert_eq!(verdict.rule, None);
    let decision = &d.records("decision")[0];
    assert_eq!(decision["exe"], "/usr/bin/true");
    assert_eq!(
        decision["advisory"]["claimed_executable"],
        "/opt/llama.cpp/bin/llama-server"
    );
    assert_eq!(decision["action"], "stock");
}

fn signed(anchor: Anchor) -> CodeSignature {
    CodeSignature {
        anchor,
        team_id: Some("ABCDE12345".into()),
        signing_id: Some("com.example.runner".into()),
        cdhash: Some(vec![0xab; 20]),
    }
}

#[tokio::test]
async fn given_a_valid_signature_then_team_rules_match_and_an_ad_hoc_one_never_does() {
    let d = Daemon::start();
    let mut developer_id = Kernel::process("/Applications/Runner.app/Contents/MacOS/runner");
    developer_id.signature = Some(signed(Anchor::DeveloperId));
    let mut ad_hoc = developer_id.clone();
    ad_hoc.pid_version += 1;
    ad_hoc.signature = Some(signed(Anchor::AdHoc));

    let unlocked = read_verdict(
        Peer::new(&d.core)
            .deliver(&check_in_claiming(None), &developer_id)
            .await
            .unwrap(),
    );
    let refused = read_verdict(
        Peer::new(&d.core)
            .deliver(&check_in_claiming(None), &ad_hoc)
            .await
            .unwrap(),
    );

    assert_eq!(unlocked.action, WireAction::Unlock);
    assert_eq!(unlocked.rule.as_deref(), Some("signed-by-us"));
    assert_eq!(refused.action, WireAction::Stock);
    let decisions = d.records("decision");
    assert_eq!(decisions[0]["team_id"], "ABCDE12345");
    assert_eq!(decisions[0]["cdhash"], "ab".repeat(20), "cdhash as 40 hex");
    assert_eq!(
        decisions[1]["team_id"],
        Value::Null,
        "ad hoc never fills team_id"
    );
    assert_eq!(
        decisions[1]["cdhash"],
        "ab".repeat(20),
        "an ad-hoc signature's cdhash still pins the exact code"
    );
    assert_eq!(decisions[0]["anchor"], "developer-id");
    assert_eq!(decisions[1]["anchor"], "ad-hoc");
}

/// The issue's attack: a binary signed with a self-signed certificate that claims
/// the fleet's team id. `SecCodeCheckValidity` without a requirement calls it
/// valid; its anchor is `untrusted`, so the claim never reaches the subject.
#[tokio::test]
async fn given_a_self_signed_certificate_claiming_the_team_then_no_team_rule_matches() {
    let d = Daemon::start();
    let mut impostor = Kernel::process("/Users/mallory/runner");
    impostor.signature = Some(signed(Anchor::Untrusted));

    let verdict = read_verdict(
        Peer::new(&d.core)
            .deliver(&check_in_claiming(None), &impostor)
            .await
            .unwrap(),
    );

    assert_eq!(verdict.action, WireAction::Stock);
    assert_eq!(verdict.rule, None);
    let decision = &d.records("decision")[0];
    assert_eq!(decision["anchor"], "untrusted");
    assert_eq!(
        decision["team_id"],
        Value::Null,
        "the claim is not recorded as the team"
    );
    assert_eq!(decision["signing_id"], Value::Null);
    assert_eq!(
        decision["cdhash"],
        "ab".repeat(20),
        "the cdhash still pins the code"
    );

    // Every Apple-chained kind counts; no other does.
    for anchor in Anchor::ALL {
        let mut k = Kernel::process("/Applications/Runner.app/Contents/MacOS/runner");
        k.signature = Some(signed(anchor));
        let v = d.core.check_in(&k.facts(), CheckIn::default(), XPC).await;
        assert_eq!(
            v.action == WireAction::Unlock,
            anchor.chains_to_apple(),
            "{anchor}"
        );
    }
}

/// Full Disk Access: the daemon could not read the executable (on macOS, TCC
/// refused the open). Through the seam: the kernel facts say so, as both
/// platform modules do when `open` fails.
#[tokio::test]
async fn given_an_executable_the_daemon_cannot_read_then_the_decision_says_so_not_unsigned() {
    let d = Daemon::start();
    let mut kernel = Kernel::process("/Users/me/Downloads/runner");
    kernel.signature = Some(CodeSignature {
        anchor: Anchor::Unreadable,
        team_id: None,
        signing_id: None,
        cdhash: None,
    });
    let mut facts = kernel.facts();
    facts.unreadable = Some("permission denied".into());

    let verdict = d.core.check_in(&facts, CheckIn::default(), XPC).await;

    assert_eq!(verdict.action, WireAction::Stock);
    let decision = &d.records("decision")[0];
    assert_eq!(decision["anchor"], "unreadable");
    assert_eq!(
        decision["identity_error"],
        "identity unreadable: permission denied"
    );
}

#[tokio::test]
async fn given_an_outcome_then_it_is_recorded_only_for_the_decision_and_process_that_asked() {
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli");

    let mut peer = Peer::new(&d.core);
    let verdict = read_verdict(
        peer.deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    assert_eq!(
        peer.deliver(&outcome(verdict.decision_id), &kernel).await,
        Ok(None)
    );
    let outcomes = d.records("outcome");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0]["decision_id"], verdict.decision_id);

    let mut peer = Peer::new(&d.core);
    let verdict = read_verdict(
        peer.deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    assert_eq!(
        peer.deliver(&outcome(verdict.decision_id + 1), &kernel)
            .await,
        Err(Refusal::WrongDecision {
            got: verdict.decision_id + 1,
            given: verdict.decision_id
        })
    );

    let mut peer = Peer::new(&d.core);
    let verdict = read_verdict(
        peer.deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    let mut exec_d = kernel.clone();
    exec_d.pid_version += 1;
    assert_eq!(
        peer.deliver(&outcome(verdict.decision_id), &exec_d).await,
        Err(Refusal::OtherProcess)
    );

    assert_eq!(
        d.records("outcome").len(),
        1,
        "refused outcomes reach no outcome record"
    );
    let refused = d.records("refused");
    let reasons: Vec<_> = refused.iter().map(|r| r["reason"].clone()).collect();
    assert_eq!(reasons, ["wrong_decision", "other_process"], "{refused:#?}");
    for r in &refused {
        assert_eq!(r["message"], "outcome");
        assert_eq!(r["exe"], "/opt/llama.cpp/bin/llama-cli");
        assert_eq!(r["transport"], XPC);
    }
    assert_eq!(
        refused[1]["uid"],
        Value::Null,
        "another process's uid is not the asker's"
    );
}

#[tokio::test]
async fn given_a_malformed_or_out_of_order_message_then_nothing_is_decided() {
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-server");

    let mut wrong_version = check_in_claiming(None);
    wrong_version[0] = 9;
    assert_eq!(
        Peer::new(&d.core).deliver(&wrong_version, &kernel).await,
        Err(Refusal::Wire(WireError::Version(9)))
    );
    assert_eq!(
        Peer::new(&d.core).deliver(&outcome(1), &kernel).await,
        Err(Refusal::Unexpected("outcome"))
    );
    let forged = to_frame(&Message::Verdict(VerdictMsg {
        decision_id: 1,
        action: WireAction::Stock,
        capabilities: None,
        profile: None,
        rule: None,
        mode: metalift_policy::Mode::Enforce,
        would_unlock: false,
    }));
    assert_eq!(
        Peer::new(&d.core).deliver(&forged, &kernel).await,
        Err(Refusal::Unexpected("verdict"))
    );

    assert!(d.records("decision").is_empty());
}

#[tokio::test]
async fn given_a_status_request_then_only_counts_come_back() {
    let d = Daemon::start();
    let kernel = Kernel::process("/usr/local/bin/metalift");
    let reply = Peer::new(&d.core)
        .deliver(&to_frame(&Message::StatusRequest), &kernel)
        .await
        .unwrap()
        .expect("answered");
    let Ok(Message::Status(json)) = decode(&reply) else {
        panic!("a status reply")
    };
    let status: Value = serde_json::from_str(&json).expect("status is JSON");
    assert!(status.is_object());
    assert!(d.records("decision").is_empty());
}

/// A `sha256` rule needs the executable's bytes. On Linux the seam is the peer
/// facts: `/proc/<pid>/exe` could not be opened (tests run as root, so file modes
/// cannot refuse it here), or the open file cannot be read while hashing (a
/// directory: `read` fails with `EISDIR`, through the real identity cache).
#[tokio::test]
async fn given_a_sha256_rule_and_an_unreadable_executable_then_the_decision_says_why() {
    let d = Daemon::start_with(&format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\
         [[rule]]\nid = \"pinned\"\nsha256 = \"{}\"\nunlock = \"apple7\"\n",
        "ab".repeat(32)
    ));
    let mut facts = Kernel::process("/home/me/tool").facts();
    facts.unreadable = Some("permission denied".into());
    let verdict = d.core.check_in(&facts, CheckIn::default(), "unix").await;
    assert_eq!(verdict.action, WireAction::Stock);

    let dir = tempfile::tempdir().expect("temp dir");
    let mut facts = Kernel::process("/home/me/tool").facts();
    facts.exe_file = Some(metalift_daemon::checkin::peer::ExeFile::new(
        std::fs::File::open(dir.path()).expect("open a directory"),
    ));
    d.core.check_in(&facts, CheckIn::default(), "unix").await;

    let decisions = d.records("decision");
    assert_eq!(
        decisions[0]["identity_error"],
        "identity unreadable: permission denied"
    );
    assert_eq!(decisions[0]["sha256"], Value::Null);
    assert_eq!(
        decisions[0]["anchor"],
        Value::Null,
        "no code signatures on this platform"
    );
    assert_eq!(
        decisions[1]["identity_error"],
        "identity unreadable: is a directory"
    );
}

/// What the shim reads back when it was declined.
fn read_declined(reply: Option<Frame>) -> Declined {
    match decode(&reply.expect("a check-in is answered")) {
        Ok(Message::Declined(d)) => d,
        other => panic!("expected a refusal the shim understands, got {other:?}"),
    }
}

/// Issue 23 item 3: a daemon that cannot tell XPC callers apart (`--no-xpc`, or a
/// macOS without the per-message audit token) still answers every check-in, at
/// once, with "use the socket"; it decides and records nothing over XPC.
#[tokio::test]
async fn given_a_daemon_that_serves_no_xpc_identities_then_each_check_in_is_told_to_use_the_socket()
{
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli");
    let places = Places::new(64, 8);
    for serving in [Serving::new(false, true), Serving::new(true, false)] {
        assert_ne!(serving, Serving::Identities);
        let mut peer = Peer::on(&d.core, serving, &places);
        let declined = read_declined(
            peer.deliver(&check_in_claiming(None), &kernel)
                .await
                .unwrap(),
        );
        assert_eq!(declined.reason, DeclineReason::UseSocket, "{serving:?}");
        assert!(!declined.detail.is_empty());
        // Status still answered: counts only.
        let status = Peer::on(&d.core, serving, &places)
            .deliver(&to_frame(&Message::StatusRequest), &kernel)
            .await
            .unwrap();
        assert!(matches!(
            decode(&status.expect("answered")),
            Ok(Message::Status(_))
        ));
    }
    assert_eq!(Serving::new(true, true), Serving::Identities);
    assert!(d.records("decision").is_empty(), "nothing decided over XPC");
    assert_eq!(places.waiting_free(), 8, "a declined peer holds no place");
}

/// Issue 23 item 2: an idle peer cannot keep a place another process needs. With
/// every place taken a check-in is answered "busy" at once (never a silent
/// cancel); the place comes back when the outcome arrives, or when the
/// exchange ends without one (here, the peer closes).
#[tokio::test]
async fn given_every_place_taken_then_a_check_in_is_answered_busy_until_an_outcome_frees_one() {
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli");
    let places = Places::new(64, 1);

    let mut first = Peer::on(&d.core, Serving::Identities, &places);
    let verdict = read_verdict(
        first
            .deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    let declined = read_declined(
        Peer::on(&d.core, Serving::Identities, &places)
            .deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    assert_eq!(declined.reason, DeclineReason::Busy);
    assert_eq!(
        d.records("decision").len(),
        1,
        "the busy one was not decided"
    );

    // The outcome frees the place at once, the connection not yet closed.
    first
        .deliver(&outcome(verdict.decision_id), &kernel)
        .await
        .unwrap();
    let mut second = Peer::on(&d.core, Serving::Identities, &places);
    read_verdict(
        second
            .deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    // No outcome: the place is held until the outcome wait ends.
    assert_eq!(places.waiting_free(), 0);
    assert_eq!(second.close().await, Ok(()));
    assert_eq!(places.waiting_free(), 1);
    assert_eq!(d.records("decision").len(), 2);
}

/// Issue 42 item 4: one euid holding 4096 silent XPC peers (as many as every
/// place at the door) never keeps another euid out: each of the flooder's peers
/// past its share takes the place of its own oldest (cancelled), and the other
/// euid's peer connects and is answered at once. Red with one global pool of
/// pending places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_one_euid_holding_4096_silent_peers_then_another_euids_check_in_is_answered() {
    let d = Daemon::start();
    let places = Places::new(64, 1024);
    let door = Door::new(&Limits::default());
    const FLOODER: u32 = 502;
    let flood: Vec<Result<Peer, Refused>> = (0..Limits::default().max_pending)
        .map(|_| Peer::connect(&d.core, Serving::Identities, &places, &door, FLOODER))
        .collect();

    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli"); // euid 501
    let start = std::time::Instant::now();
    let mut victim = Peer::connect(&d.core, Serving::Identities, &places, &door, kernel.euid)
        .expect("another euid's peer is not cancelled at the door");
    let verdict = read_verdict(
        victim
            .deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    let took = start.elapsed();
    assert_eq!(verdict.action, WireAction::Unlock);
    // The shim's default deadline is 2 s; the flooder's peers stay silent for 1 s.
    assert!(
        took < std::time::Duration::from_millis(500),
        "answered in {took:?}"
    );
    assert!(flood.iter().all(Result::is_ok), "none refused at the door");
    // Each past the share took the place of the flooder's own oldest; the
    // victim's place went back when its check-in was admitted.
    assert_eq!(
        door.held(),
        door.per_user(),
        "the flooder holds its share, no more"
    );
    drop(flood);
}

/// Issue 24 item 3: no identity from the connection's token. A check-in or an
/// outcome that carries no audit token of its own is refused and recorded; the
/// check-in is answered "use the socket" (the shim asks there within its
/// deadline), and holds no place.
#[tokio::test]
async fn given_a_message_without_its_own_audit_token_then_it_is_refused_and_recorded() {
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli");

    let places = Places::new(64, 8);
    let mut unstamped = Peer::on(&d.core, Serving::Identities, &places);
    let declined = read_declined(
        unstamped
            .deliver_stamped(&check_in_claiming(None), None)
            .await
            .unwrap(),
    );
    assert_eq!(declined.reason, DeclineReason::UseSocket);
    assert_eq!(places.waiting_free(), 8, "its place was given back");
    assert_eq!(unstamped.close().await, Err(Refusal::NoAuditToken));
    assert!(d.records("decision").is_empty());

    let mut peer = Peer::new(&d.core);
    let verdict = read_verdict(
        peer.deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    assert_eq!(
        peer.deliver_stamped(&outcome(verdict.decision_id), None)
            .await,
        Err(Refusal::NoAuditToken)
    );
    assert!(d.records("outcome").is_empty());

    let records = d.records("refused");
    let seen: Vec<_> = records
        .iter()
        .map(|r| (r["message"].clone(), r["reason"].clone(), r["pid"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            ("check_in".into(), "no_audit_token".into(), Value::Null),
            ("outcome".into(), "no_audit_token".into(), 4242.into()),
        ]
    );
    assert_eq!(records[1]["decision_id"], verdict.decision_id);
}

/// Issue 24 item 2: a malformed outcome, and an outcome on a connection that
/// checked in for nothing, are records of their own.
#[tokio::test]
async fn given_a_malformed_outcome_or_one_without_a_check_in_then_each_is_a_refused_record() {
    let d = Daemon::start();
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli");
    let mut peer = Peer::new(&d.core);
    let verdict = read_verdict(
        peer.deliver(&check_in_claiming(None), &kernel)
            .await
            .unwrap(),
    );
    let mut broken = outcome(verdict.decision_id);
    broken[0] = 9;
    assert!(matches!(
        peer.deliver(&broken, &kernel).await,
        Err(Refusal::Wire(_))
    ));
    assert_eq!(
        Peer::new(&d.core).deliver(&outcome(77), &kernel).await,
        Err(Refusal::Unexpected("outcome"))
    );
    let reasons: Vec<_> = d
        .records("refused")
        .iter()
        .map(|r| r["reason"].clone())
        .collect();
    assert_eq!(reasons, ["malformed", "unexpected"]);
}

/// Issue 24 item 4: `sha256` counts only when the running code matches its file.
/// The seam is the signature check's result: `errSecCSStaticCodeChanged`, which
/// macOS reports for a process whose executable was replaced since it started,
/// run through the same `signature::file_hashes` as `peer/macos.rs`.
#[tokio::test]
async fn given_code_that_no_longer_matches_its_file_then_sha256_rules_do_not_match_and_the_record_says_why(
) {
    use metalift_daemon::checkin::peer::signature::{self, ERR_SEC_CS_STATIC_CODE_CHANGED};
    use sha2::Digest;

    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("tool");
    std::fs::write(&exe, b"the replacement's bytes").expect("write");
    let hash = hex::encode(sha2::Sha256::digest(b"the replacement's bytes"));
    let d = Daemon::start_with(&format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\
         [[rule]]\nid = \"pinned\"\nsha256 = \"{hash}\"\nunlock = \"apple7\"\n"
    ));
    let facts_with = |validity_status| {
        let mut facts = Kernel::process(exe.to_str().unwrap()).facts();
        facts.exe_file = Some(metalift_daemon::checkin::peer::ExeFile::new(
            std::fs::File::open(&exe).expect("open"),
        ));
        facts.hashes_withheld = signature::file_hashes(validity_status)
            .err()
            .map(str::to_owned);
        facts
    };

    let matching = d
        .core
        .check_in(&facts_with(0), CheckIn::default(), XPC)
        .await;
    assert_eq!(
        matching.action,
        WireAction::Unlock,
        "the control: the file's hash matches"
    );
    let changed = d
        .core
        .check_in(
            &facts_with(ERR_SEC_CS_STATIC_CODE_CHANGED),
            CheckIn::default(),
            XPC,
        )
        .await;
    assert_eq!(changed.action, WireAction::Stock);

    let decisions = d.records("decision");
    assert_eq!(decisions[0]["sha256"], hash);
    assert_eq!(decisions[1]["sha256"], Value::Null);
    assert_eq!(decisions[1]["rule"], Value::Null);
    assert_eq!(
        decisions[1]["identity_error"],
        "file hashes not used: the running code no longer matches its file (errSecCSStaticCodeChanged)"
    );
}

/// Reading who sent a check-in can block (`SecCode` reads the executable):
/// `xpc_peer::serve` does it on the core's bounded blocking pool, for the libxpc
/// link as for this one, never on the daemon's async threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_slow_identification_then_it_holds_a_worker_of_the_cores_blocking_pool() {
    let d = Daemon::start();
    let gate = Arc::new(std::sync::Barrier::new(2));
    let mut kernel = Kernel::process("/opt/llama.cpp/bin/llama-server");
    kernel.gate = Some(Arc::clone(&gate));
    let idle = d.core.blocking().available();

    let mut peer = Peer::new(&d.core);
    let asked = tokio::spawn(async move {
        let reply = peer.deliver(&check_in_claiming(None), &kernel).await;
        (peer, reply)
    });
    let meet = |gate: Arc<std::sync::Barrier>| async move {
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tokio::task::spawn_blocking(move || {
                gate.wait();
            }),
        )
        .await
        .expect("the identification reached the gate")
        .expect("the gate's thread");
    };
    meet(Arc::clone(&gate)).await;
    let during = d.core.blocking().available();
    meet(gate).await;
    let (_peer, reply) = asked.await.expect("the peer's task");
    let verdict = read_verdict(reply.expect("answered"));

    assert_eq!(
        during,
        idle - 1,
        "the identification held a worker of the core's blocking pool"
    );
    assert_eq!(verdict.action, WireAction::Unlock);
    assert_eq!(d.core.blocking().available(), idle, "and gave it back");
}

/// The socket's peer, as "the kernel" names it to the Unix transport: the same
/// process the XPC exchanges name.
#[derive(Debug)]
struct SocketKernel(Kernel);

impl metalift_daemon::checkin::peer::IdentifyPeer for SocketKernel {
    fn identify(
        &self,
        _socket: std::os::fd::BorrowedFd<'_>,
        _wants: metalift_daemon::checkin::peer::Wants,
    ) -> Result<PeerFacts, metalift_daemon::checkin::peer::PeerError> {
        Ok(self.0.facts())
    }
}

/// What a shim sends after its verdict.
#[derive(Debug, Clone, Copy)]
enum After {
    /// Its outcome.
    Outcome,
    /// An outcome naming another decision.
    WrongDecision,
    /// An outcome that does not decode.
    Malformed,
    /// Nothing: it closes.
    Nothing,
}

const EXCHANGES: [After; 4] = [
    After::Outcome,
    After::WrongDecision,
    After::Malformed,
    After::Nothing,
];

/// Reads frames until the daemon closes; returns the first.
async fn read_to_close(stream: &mut tokio::net::UnixStream) -> Option<Message> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    loop {
        if let Ok(Some((msg, _))) = metalift_policy::wire::decode_frame(&buf) {
            return Some(msg);
        }
        if stream.read_buf(&mut buf).await.unwrap_or(0) == 0 {
            return None;
        }
    }
}

/// [`EXCHANGES`] and then an outcome sent first, over the Unix socket.
async fn over_the_socket(socket: &Path) {
    use metalift_policy::wire::encode_frame;
    use tokio::io::AsyncWriteExt;
    for after in EXCHANGES {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .expect("connect");
        let check_in = encode_frame(&Message::CheckIn(CheckIn::default()));
        stream.write_all(&check_in).await.expect("send");
        let Some(Message::Verdict(verdict)) = read_to_close(&mut stream).await else {
            panic!("a verdict");
        };
        let id = verdict.decision_id;
        let frame = match after {
            After::Outcome => Some(encode_frame(&outcome_message(id))),
            After::WrongDecision => Some(encode_frame(&outcome_message(id + 1))),
            After::Malformed => {
                let mut frame = encode_frame(&outcome_message(id));
                // The body's first byte is the protocol version.
                frame[metalift_policy::wire::LENGTH_PREFIX] ^= 0xff;
                Some(frame)
            }
            After::Nothing => None,
        };
        if let Some(frame) = frame {
            stream.write_all(&frame).await.expect("send");
        }
        let _ = stream.shutdown().await;
        // Recorded by the time the daemon closes its side.
        assert!(read_to_close(&mut stream).await.is_none());
    }
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let frame = encode_frame(&outcome_message(77));
    stream.write_all(&frame).await.expect("send");
    assert!(read_to_close(&mut stream).await.is_none());
}

/// [`EXCHANGES`] and then an outcome sent first, over the XPC exchange.
async fn over_xpc(core: &Arc<Core>, kernel: &Kernel) {
    for after in EXCHANGES {
        let mut peer = Peer::new(core);
        let verdict = read_verdict(
            peer.deliver(&check_in_claiming(None), kernel)
                .await
                .unwrap(),
        );
        let id = verdict.decision_id;
        let dict = match after {
            After::Outcome => Some(outcome(id)),
            After::WrongDecision => Some(outcome(id + 1)),
            After::Malformed => {
                let mut dict = outcome(id);
                dict[0] = 9;
                Some(dict)
            }
            After::Nothing => None,
        };
        if let Some(dict) = dict {
            let _ = peer.deliver(&dict, kernel).await;
        } else {
            assert_eq!(peer.close().await, Ok(()));
        }
    }
    let refused = Peer::new(core).deliver(&outcome(77), kernel).await;
    assert_eq!(refused, Err(Refusal::Unexpected("outcome")));
}

/// A record as a user of the log compares them across transports: what was
/// decided, reported or refused, about whom, and whether it names the
/// decision before it.
fn in_common(records: &[Value]) -> Vec<Value> {
    let mut last_decision = Value::Null;
    records
        .iter()
        .filter(|r| ["decision", "outcome", "refused"].contains(&r["kind"].as_str().unwrap_or("")))
        .map(|r| {
            let names_last = !r["decision_id"].is_null() && r["decision_id"] == last_decision;
            if r["kind"] == "decision" {
                last_decision = r["decision_id"].clone();
            }
            let keep = [
                "kind", "action", "rule", "exe", "uid", "message", "reason", "result",
            ];
            let mut common = serde_json::Map::new();
            for key in keep {
                common.insert(key.into(), r[key].clone());
            }
            common.insert("names_the_decision".into(), names_last.into());
            Value::Object(common)
        })
        .collect()
}

/// Issue 31 item 9: the steps exist once, so the same exchanges over the Unix
/// socket and over XPC leave the same records, but for the transport's name
/// (and for what only XPC's kernel says: the pid of a sender that checked in
/// for nothing, and the pids in an other-process refusal). If either
/// transport decided, checked or recorded on its own, they would differ.
#[tokio::test]
async fn given_the_same_exchanges_over_the_socket_and_over_xpc_then_the_records_match() {
    let kernel = Kernel::process("/opt/llama.cpp/bin/llama-cli");

    let over_socket = Daemon::start();
    let socket = over_socket._dir.path().join("metalift.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        metalift_daemon::checkin::transport::unix::run_with_identity(
            listener,
            Arc::clone(&over_socket.core),
            Limits::default(),
            Arc::new(SocketKernel(kernel.clone())),
            async {
                let _ = stopped.await;
            },
        ),
    );
    over_the_socket(&socket).await;
    let _ = stop.send(());
    server.await.expect("the socket transport stops");

    let over_xpc_daemon = Daemon::start();
    over_xpc(&over_xpc_daemon.core, &kernel).await;

    let socket_records = records(&over_socket.audit_path);
    let xpc_records = records(&over_xpc_daemon.audit_path);
    let (by_socket, by_xpc) = (in_common(&socket_records), in_common(&xpc_records));
    assert_eq!(by_socket.len(), 4 + 3 + 1, "{by_socket:#?}");
    assert_eq!(by_socket, by_xpc);
    for (records, transport) in [(&socket_records, "unix"), (&xpc_records, "xpc")] {
        for r in records
            .iter()
            .filter(|r| r["kind"] == "decision" || r["kind"] == "refused")
        {
            assert_eq!(r["transport"], transport);
        }
    }
}
