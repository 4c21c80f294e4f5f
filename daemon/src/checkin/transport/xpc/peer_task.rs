//! One XPC peer connection on the tokio side, from its first message to its
//! outcome: what `super` hands over once libxpc has delivered the peer. The order
//! and the checks are `metalift_xpc::exchange`'s; this moves messages between
//! libxpc and the core, holds the peer's places, and has the core record what it
//! refuses.

use std::sync::Arc;

use metalift_policy::wire::Message;
use metalift_xpc::dict as wire_dict;
use metalift_xpc::exchange::{self, Admission, Refusal, Sender, Serving};
use metalift_xpc::xpc_dict::XpcDict;
use tokio::sync::{broadcast, mpsc, Semaphore};

use super::{Accepted, Connection, PeerEvent, TRANSPORT};
use crate::checkin::peer::{self, PeerFacts};
use crate::checkin::per_user::UserLimit;
use crate::checkin::server::{Core, Refusing};
use crate::checkin::transport::Limits;
use crate::macos::audit_token::AuditToken;

/// Why a peer was closed early.
#[derive(Debug, thiserror::Error)]
pub(super) enum PeerError {
    #[error("no message within the first-message deadline")]
    Deadline,
    #[error("no outcome within the outcome wait")]
    Idle,
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("a request was sent without a reply handler")]
    NoReplyExpected,
    #[error("cannot identify the peer: {0}")]
    Peer(#[from] peer::PeerError),
    #[error("identification task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("encoding the status: {0}")]
    Status(#[from] serde_json::Error),
}

/// Serves one peer connection on the tokio side.
pub(super) struct PeerTask {
    pub(super) core: Arc<Core>,
    pub(super) limits: Limits,
    /// Whether check-ins are decided here or sent to the socket.
    pub(super) serving: Serving,
    /// Places for check-ins being identified and decided ([`Limits::max_active`]).
    pub(super) active: Arc<Semaphore>,
    /// Places for check-ins from admission to outcome ([`Limits::max_waiting`]).
    pub(super) places: Arc<Semaphore>,
    /// Each uid's share of the active places, taken first.
    pub(super) active_per_user: UserLimit,
    /// Each uid's share of the places, taken first: one user's idle check-ins
    /// never make another user's `Busy` (issue v5, item 6).
    pub(super) places_per_user: UserLimit,
    /// Wakes when the daemon stops.
    pub(super) shutdown: broadcast::Receiver<()>,
    /// Held, never used: its drop tells [`super::run`] this peer is done.
    pub(super) _done: mpsc::Sender<()>,
}

impl PeerTask {
    /// The exchange's order and checks are `metalift_xpc::exchange`'s; this only
    /// moves messages between libxpc and the core.
    pub(super) async fn serve(mut self, mut accepted: Accepted) -> Result<(), PeerError> {
        let first_message = self
            .limits
            .first_frame_timeout
            .min(self.limits.read_timeout);
        let first = tokio::select! {
            event = tokio::time::timeout(first_message, accepted.events.recv()) => {
                event.map_err(|_| PeerError::Deadline)?
            }
            _ = self.shutdown.recv() => return Ok(()),
        };
        let Some(PeerEvent::Message { dict, token }) = first else {
            return Ok(());
        };
        let request = match exchange::first(wire_dict::decode(&dict)) {
            Ok(request) => request,
            Err(refusal) => {
                if refusal == Refusal::Unexpected("outcome") {
                    self.refuse(&refusal, token.as_ref(), None, None);
                }
                return Err(refusal.into());
            }
        };
        // A request sent without a reply handler cannot be answered: refuse it
        // before anything is decided or recorded.
        let mut answer = XpcDict::reply_to(&dict).ok_or(PeerError::NoReplyExpected)?;
        // The kernel's euid for the message (no token: one bucket for all such).
        let uid = token.as_ref().map_or(u32::MAX, AuditToken::euid);
        let place = self.places_per_user.try_acquire(uid).and_then(|user| {
            Arc::clone(&self.places)
                .try_acquire_owned()
                .ok()
                .map(|global| (user, global))
        });
        let req = match exchange::admit(request, self.serving, place.is_some()) {
            Admission::Status => {
                let json = serde_json::to_string(&self.core.status())?;
                reply(&accepted.peer, &mut answer, &Message::Status(json));
                return Ok(());
            }
            Admission::Decline(declined) => {
                tracing::debug!(reason = declined.reason.as_str(), "XPC check-in declined");
                reply(&accepted.peer, &mut answer, &Message::Declined(declined));
                // No place while it lingers; still one of the pending ones, so
                // lingering declined peers stay bounded by `max_pending`.
                drop(place);
                self.linger(&mut accepted.events, first_message).await;
                return Ok(());
            }
            Admission::Decide(req) => req,
        };
        let asker_token = match token {
            Some(token) => token,
            None => {
                let refusal = Refusal::NoAuditToken;
                self.refuse(&refusal, None, None, None);
                reply(
                    &accepted.peer,
                    &mut answer,
                    &Message::Declined(metalift_policy::wire::Declined {
                        reason: metalift_policy::wire::DeclineReason::UseSocket,
                        detail: refusal.to_string(),
                    }),
                );
                drop(place);
                self.linger(&mut accepted.events, first_message).await;
                return Err(refusal.into());
            }
        };
        drop(accepted.pending);

        // Not raced against shutdown: a check-in that arrived is decided, recorded
        // and answered.
        let user_active = self.active_per_user.acquire(uid).await;
        let Ok(active) = Arc::clone(&self.active).acquire_owned().await else {
            return Ok(()); // never closed
        };
        // SecCode reads the executable: on the core's bounded blocking pool,
        // within this uid's share of it.
        let facts = self
            .core
            .blocking()
            .run_for(uid, move || peer::facts_from_audit_token(asker_token))
            .await??;
        let verdict = self.core.check_in(&facts, req, TRANSPORT).await;
        let given = verdict.decision_id;
        reply(&accepted.peer, &mut answer, &Message::Verdict(verdict));
        drop(active);
        drop(user_active);
        // Counted in `metalift status` as waiting, as on the socket.
        let _waiting = self.core.count_waiting();

        // The shim reports as soon as Metal's original `initGPUFamilySupport`
        // returns: this wait, and the place, last seconds at most.
        let next = tokio::select! {
            event = tokio::time::timeout(self.limits.outcome_idle, accepted.events.recv()) => {
                event.map_err(|_| PeerError::Idle)?
            }
            _ = self.shutdown.recv() => return Ok(()),
        };
        let Some(PeerEvent::Message {
            dict,
            token: sent_by,
        }) = next
        else {
            return Ok(());
        };
        let outcome = match exchange::outcome(
            wire_dict::decode(&dict),
            sent_by.as_ref().map(sender),
            sender(&asker_token),
            given,
        ) {
            Ok(outcome) => outcome,
            Err(refusal) => {
                self.refuse(&refusal, sent_by.as_ref(), Some(&facts), Some(given));
                return Err(refusal.into());
            }
        };
        self.core.outcome(&facts, outcome).await;
        drop(place);
        Ok(())
    }

    /// After a reply that ends the exchange, lets the peer close first (the shim
    /// cancels once it has read it), for at most `deadline`: cancelling our side
    /// right after the send could race the reply's delivery.
    async fn linger(
        &mut self,
        events: &mut mpsc::Receiver<PeerEvent>,
        deadline: std::time::Duration,
    ) {
        let closed = async { while let Some(PeerEvent::Message { .. }) = events.recv().await {} };
        tokio::select! {
            _ = tokio::time::timeout(deadline, closed) => {}
            _ = self.shutdown.recv() => {}
        }
    }

    /// Records a refused message: an outcome (`asker` known once a check-in was
    /// decided on this connection) or a check-in without a token.
    fn refuse(
        &self,
        refusal: &Refusal,
        sent_by: Option<&AuditToken>,
        asker: Option<&PeerFacts>,
        given: Option<u64>,
    ) {
        let message = if refusal == &Refusal::NoAuditToken && asker.is_none() {
            "check_in"
        } else {
            "outcome"
        };
        self.core.refuse(Refusing {
            message,
            reason: refusal.code(),
            detail: match (refusal, sent_by) {
                (Refusal::OtherProcess, Some(t)) => format!(
                    "{refusal}: sent by pid {} (version {}), the check-in came from pid {}",
                    t.pid(),
                    t.pid_version(),
                    asker.map_or(0, |a| a.pid)
                ),
                _ => refusal.to_string(),
            },
            sender_pid: sent_by.map(AuditToken::pid),
            asker,
            sent_by_asker: asker.is_some() && *refusal != Refusal::OtherProcess,
            decision_id: given,
            transport: TRANSPORT,
        });
    }
}

/// The exchange's view of an audit token.
fn sender(token: &AuditToken) -> Sender {
    Sender {
        pid: token.pid(),
        pid_version: token.pid_version(),
    }
}

/// Sends `msg` on `peer` in `answer` (the reply dictionary made for the request).
fn reply(peer: &Connection, answer: &mut XpcDict, msg: &Message) {
    wire_dict::encode(msg, answer);
    peer.send(answer);
}
