//! One XPC peer connection on the tokio side: the libxpc [`PeerLink`] that
//! [`xpc_peer::serve`] drives. The steps (admission, the token check, the
//! decision, the outcome, every refusal and place) are
//! [`crate::checkin::session`]'s and their order and waits are `xpc_peer`'s,
//! shared with the in-memory stand-in in `daemon/tests/core_in_memory.rs`; this
//! only moves messages between libxpc and them, each a frame body in one data
//! value (`metalift_xpc::frame`), and reads a sender's identity from its audit
//! token when `serve` asks. An older shim's dictionary is answered here, in its
//! own words, with "use the socket" (`metalift_xpc::frame` says why): nothing is
//! decided for it over XPC.

use std::time::Duration;

use metalift_policy::wire::Message;
use metalift_xpc::exchange::{Sender, Serving};
use metalift_xpc::frame::Received;
use metalift_xpc::message::XpcMessage;
use tokio::sync::{broadcast, mpsc};

use super::{Accepted, Connection, PeerEvent};
use crate::checkin::peer::{self, PeerFacts};
use crate::checkin::session::Session;
use crate::checkin::transport::xpc_peer::{self, Event, PeerError, PeerLink, Stamp};
use crate::checkin::transport::Limits;
use crate::macos::audit_token::AuditToken;

/// How long an older shim, answered "use the socket", is given to close first
/// (it reads the reply and goes to the socket at once; the peer's pending place
/// is held meanwhile, so lingering peers stay bounded like every pending one).
const OLDER_SHIM_LINGER: Duration = Duration::from_secs(1);

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

impl Libxpc {
    /// An older shim's dictionary (`metalift_xpc::frame::Received::OlderShim`):
    /// logged, and answered "declined: use the socket" in its layout, which it
    /// follows at once within its deadline; then the peer closes first.
    async fn decline_older_shim(&mut self, request: XpcMessage, pid: Option<u32>) {
        tracing::warn!(
            pid,
            "an older libmetalift checked in over XPC with a dictionary this metaliftd no \
             longer reads: answered \"use the socket\" (restart that process to load the \
             installed shim)"
        );
        let reply = XpcMessage::reply_to(&request);
        drop(request); // not `Sync`: never held across the await below
        if let Some(mut reply) = reply {
            reply.set_legacy_decline();
            self.peer.send(&reply);
            let _ = tokio::time::timeout(OLDER_SHIM_LINGER, self.closed()).await;
        }
    }
}

impl PeerLink for Libxpc {
    type Token = AuditToken;
    type Reply = XpcMessage;

    fn stamp(token: &AuditToken) -> Stamp {
        Stamp {
            sender: Sender {
                pid: token.pid(),
                pid_version: token.pid_version(),
            },
            uid: token.euid(),
        }
    }

    async fn next(&mut self) -> Event<AuditToken, XpcMessage> {
        let event = tokio::select! {
            event = self.events.recv() => event,
            _ = self.shutdown.recv() => return Event::Closed,
        };
        match event {
            Some(PeerEvent::Message { dict, token }) => match dict.decode() {
                Received::Message(message) => Event::Message {
                    message,
                    reply: XpcMessage::reply_to(&dict),
                    token,
                },
                Received::OlderShim => {
                    self.decline_older_shim(dict, token.map(|t| t.pid())).await;
                    Event::Closed
                }
            },
            Some(PeerEvent::Closed) | None => Event::Closed,
        }
    }

    fn reply(&mut self, mut to: XpcMessage, message: &Message) {
        to.set(message);
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
