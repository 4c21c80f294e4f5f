//! One XPC peer connection on the tokio side: the libxpc [`PeerLink`] that
//! [`xpc_peer::serve`] drives. The steps (admission, the token check, the
//! decision, the outcome, every refusal and place) are
//! [`crate::checkin::session`]'s and their order and waits are `xpc_peer`'s,
//! shared with the in-memory stand-in in `daemon/tests/core_in_memory.rs`; this
//! only moves messages between libxpc and them, and reads a sender's identity
//! from its audit token when `serve` asks.

use metalift_policy::wire::Message;
use metalift_xpc::dict as wire_dict;
use metalift_xpc::exchange::{Sender, Serving};
use metalift_xpc::xpc_dict::XpcDict;
use tokio::sync::{broadcast, mpsc};

use super::{Accepted, Connection, PeerEvent};
use crate::checkin::peer::{self, PeerFacts};
use crate::checkin::session::Session;
use crate::checkin::transport::xpc_peer::{self, Event, PeerError, PeerLink, Stamp};
use crate::checkin::transport::Limits;
use crate::macos::audit_token::AuditToken;

/// Serves one peer connection on the tokio side.
pub(super) struct PeerTask {
    /// The transport's steps and places.
    pub(super) session: Session,
    pub(super) limits: Limits,
    /// Whether check-ins are decided here or sent to the socket.
    pub(super) serving: Serving,
    /// Wakes when the daemon stops.
    pub(super) shutdown: broadcast::Receiver<()>,
    /// Held, never used: its drop tells [`super::run`] this peer is done.
    pub(super) _done: mpsc::Sender<()>,
}

impl PeerTask {
    /// Runs [`xpc_peer::serve`] over this peer's libxpc link.
    pub(super) async fn serve(self, accepted: Accepted) -> Result<(), PeerError> {
        let Accepted {
            peer,
            events,
            pending,
        } = accepted;
        let mut link = Libxpc {
            peer,
            events,
            shutdown: self.shutdown,
        };
        xpc_peer::serve(&self.session, self.serving, self.limits, &mut link, pending).await
    }
}

/// The libxpc side of one peer: its connection, the messages its handler
/// forwards (with their audit tokens), and the daemon's shutdown.
struct Libxpc {
    peer: Connection,
    events: mpsc::Receiver<PeerEvent>,
    shutdown: broadcast::Receiver<()>,
}

impl PeerLink for Libxpc {
    type Token = AuditToken;
    type Reply = XpcDict;

    fn stamp(token: &AuditToken) -> Stamp {
        Stamp {
            sender: Sender {
                pid: token.pid(),
                pid_version: token.pid_version(),
            },
            uid: token.euid(),
        }
    }

    async fn next(&mut self) -> Event<AuditToken, XpcDict> {
        let event = tokio::select! {
            event = self.events.recv() => event,
            _ = self.shutdown.recv() => return Event::Closed,
        };
        match event {
            Some(PeerEvent::Message { dict, token }) => Event::Message {
                message: wire_dict::decode(&dict),
                reply: XpcDict::reply_to(&dict),
                token,
            },
            Some(PeerEvent::Closed) | None => Event::Closed,
        }
    }

    fn reply(&mut self, mut to: XpcDict, message: &Message) {
        wire_dict::encode(message, &mut to);
        self.peer.send(&to);
    }

    fn identify(token: AuditToken) -> Result<PeerFacts, peer::PeerError> {
        peer::facts_from_audit_token(token)
    }

    async fn closed(&mut self) {
        let events = &mut self.events;
        let closed = async { while let Some(PeerEvent::Message { .. }) = events.recv().await {} };
        tokio::select! {
            () = closed => {}
            _ = self.shutdown.recv() => {}
        }
    }
}
