//! One XPC peer connection, from its first message to its outcome, on any OS:
//! the sequence of [`Session`] steps an XPC peer goes through, written once.
//!
//! Only the link to libxpc differs between the real transport and its test
//! double, and it sits behind [`PeerLink`]: `xpc/peer_task.rs` (macOS) moves
//! messages between libxpc and [`serve`]; `daemon/tests/core_in_memory.rs`
//! moves frame bodies between a test and [`serve`] in memory. Neither can
//! decide, check, record or hold a place itself: a link is never given the
//! [`Session`], and the waits and the identification's place on the blocking
//! pool are [`serve`]'s too, so the tests of the stand-in cover them for libxpc.
#![forbid(unsafe_code)]

use std::future::Future;
use std::time::Duration;

use metalift_policy::wire::{Message, WireError};
use metalift_xpc::exchange::{Refusal, Sender, Serving};

use crate::checkin::peer::{self, PeerFacts};
use crate::checkin::session::{Admission, Origin, Session};
use crate::checkin::transport::door::Pass;
use crate::checkin::transport::Limits;

/// Messages a peer may have queued before further ones are dropped: a shim sends two.
pub const PEER_QUEUE: usize = 4;

/// What the kernel says about a message's sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The sending process (pid and pid version).
    pub sender: Sender,
    /// Its effective uid: whose share of the places it takes.
    pub uid: u32,
}

/// What a peer's link delivers.
#[derive(Debug)]
pub enum Event<T, R> {
    /// A message: decoded from its dictionary, with the kernel's token for this
    /// message (`None`: none could be read) and the means to answer it
    /// (`None`: it was sent without a reply handler).
    Message {
        /// The dictionary's frame, decoded (`metalift_xpc::frame::decode`).
        message: Result<Message, WireError>,
        /// The kernel's per-message token.
        token: Option<T>,
        /// How to answer it.
        reply: Option<R>,
    },
    /// The peer closed, or the daemon is stopping: end quietly.
    Closed,
}

/// The libxpc side of one peer connection, or its stand-in: it only moves
/// messages, and reads who sent one when [`serve`] asks.
pub trait PeerLink: Send + 'static {
    /// What the kernel attaches to a message (the audit token on macOS).
    type Token: Send + 'static;
    /// The reply dictionary made for one request.
    type Reply: Send;
    /// The kernel's words about `token`'s sender.
    fn stamp(token: &Self::Token) -> Stamp;
    /// The next event ([`serve`] bounds the wait).
    fn next(&mut self) -> impl Future<Output = Event<Self::Token, Self::Reply>> + Send;
    /// Sends `message` as the reply `to` a request.
    fn reply(&mut self, to: Self::Reply, message: &Message);
    /// Who sent the message stamped `token`. It blocks (`SecCode` reads the
    /// executable): [`serve`] runs it on the core's bounded blocking pool,
    /// within the sender's uid's share.
    fn identify(token: Self::Token) -> Result<PeerFacts, peer::PeerError>;
    /// Resolves once the peer has closed (or the daemon stops), dropping what
    /// it sends meanwhile ([`serve`] bounds the wait).
    fn closed(&mut self) -> impl Future<Output = ()> + Send;
}

/// The next event, or `None` when nothing arrived within `wait`.
async fn next<L: PeerLink>(link: &mut L, wait: Duration) -> Option<Event<L::Token, L::Reply>> {
    tokio::time::timeout(wait, link.next()).await.ok()
}

/// After a reply that ends the exchange, lets the peer close first (the shim
/// cancels once it has read it), for at most `wait`: cancelling right after the
/// send could race the reply's delivery.
async fn linger<L: PeerLink>(link: &mut L, wait: Duration) {
    let _ = tokio::time::timeout(wait, link.closed()).await;
}

/// Why a peer was closed early.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The first message did not come in time.
    #[error("no message within the first-message deadline")]
    Deadline,
    /// Its place at the door went to another uid's peer before it sent anything.
    #[error("its place at the door went to another uid's peer")]
    Evicted,
    /// The outcome did not come in time (the decision stays without one).
    #[error("no outcome within the outcome wait")]
    Idle,
    /// A message refused (recorded where [`Session`] records it).
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// A request that cannot be answered.
    #[error("a request was sent without a reply handler")]
    NoReplyExpected,
    /// The kernel could not say who sent it.
    #[error("cannot identify the peer: {0}")]
    Peer(#[from] peer::PeerError),
    /// The identification's blocking task failed.
    #[error("identification task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The status could not be encoded.
    #[error("encoding the status: {0}")]
    Status(#[from] serde_json::Error),
}

/// Serves one peer over `link` with `session`'s steps: `serving` says whether
/// check-ins are decided here, `pending` is the peer's place at the door
/// ([`crate::checkin::transport::door`], taken for the peer's euid when it
/// connected), given back once its check-in is admitted and stamped.
pub async fn serve<L: PeerLink>(
    session: &Session,
    serving: Serving,
    limits: Limits,
    link: &mut L,
    pending: Pass,
) -> Result<(), PeerError> {
    let first_message = limits.first_frame_timeout.min(limits.read_timeout);
    let first = tokio::select! {
        first = next(link, first_message) => first,
        () = pending.evicted() => return Err(PeerError::Evicted),
    };
    let (message, token, reply) = match first {
        Some(Event::Message {
            message,
            token,
            reply,
        }) => (message, token, reply),
        Some(Event::Closed) => return Ok(()),
        None => return Err(PeerError::Deadline),
    };
    let stamp = token.as_ref().map(L::stamp);
    let request = session.first(message, Origin::Message(stamp.map(|s| s.sender)))?;
    // A request sent without a reply handler cannot be answered: refused
    // before anything is decided or recorded.
    let reply = reply.ok_or(PeerError::NoReplyExpected)?;
    // The kernel's euid for the message (no token: one bucket for all such).
    let uid = stamp.map_or(u32::MAX, |s| s.uid);
    let admitted = match session.admit(request, serving, uid) {
        Admission::Status => {
            link.reply(reply, &session.status()?);
            return Ok(());
        }
        Admission::Decline(declined) => {
            tracing::debug!(reason = declined.reason.as_str(), "XPC check-in declined");
            link.reply(reply, &Message::Declined(declined));
            // No place while it lingers; still one of the pending ones, so
            // lingering declined peers stay bounded by `max_pending`.
            linger(link, first_message).await;
            return Ok(());
        }
        Admission::Decide(admitted) => admitted,
    };
    let (Some(token), Some(stamp)) = (token, stamp) else {
        let declined = session.refuse_unstamped(admitted);
        link.reply(reply, &Message::Declined(declined));
        linger(link, first_message).await;
        return Err(Refusal::NoAuditToken.into());
    };
    drop(pending);

    let Some(active) = session.activate(uid).await else {
        return Ok(()); // never closed
    };
    let identified = session
        .core()
        .blocking()
        .run_for(uid, move || L::identify(token))
        .await?;
    let facts = match identified {
        Ok(facts) => facts,
        Err(error) => {
            session.unidentified(&error);
            return Err(error.into());
        }
    };
    let asker = Origin::Message(Some(stamp.sender));
    let (verdict, answered) = session.decide(admitted, facts, asker, active).await;
    link.reply(reply, &Message::Verdict(verdict));
    let awaiting = answered.answered();

    // The shim reports as soon as Metal's original `initGPUFamilySupport`
    // returns: this wait, and the place, last seconds at most.
    let (message, token) = match next(link, limits.outcome_idle).await {
        Some(Event::Message { message, token, .. }) => (message, token),
        Some(Event::Closed) => return Ok(()),
        None => return Err(PeerError::Idle),
    };
    let origin = Origin::Message(token.as_ref().map(|t| L::stamp(t).sender));
    session.outcome(awaiting, message, origin).await?;
    Ok(())
}
