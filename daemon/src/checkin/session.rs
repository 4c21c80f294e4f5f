//! The steps of one check-in that do not depend on how it arrived, written once
//! and called by every transport (the Unix socket, the XPC peer task, and the
//! in-memory XPC stand-in of `daemon/tests/core_in_memory.rs`):
//!
//! 1. [`Session::first`]: what the first message asks for; an outcome sent before
//!    any check-in is refused and recorded;
//! 2. [`Session::admit`]: status, declined (use the socket; busy: no waiting
//!    place for this uid or at all), or admitted with a waiting place
//!    ([`Admitted`]) held until the outcome;
//! 3. the token check: an admitted check-in whose message the kernel did not
//!    stamp ([`Session::refuse_unstamped`]) is refused, recorded and declined;
//! 4. [`Session::activate`]: an active place (this uid's share first);
//!    [`Session::unidentified`] when the kernel cannot say who asked;
//! 5. [`Session::decide`]: the core decides and records; the verdict is sent
//!    and [`Answered::answered`] gives the active place back;
//! 6. [`Session::outcome`]: the outcome is checked (same process, same
//!    decision) and recorded, or refused and recorded; either way the waiting
//!    place is released, as it is when an [`Awaiting`] is dropped (silence,
//!    hang-up, shutdown).
//!
//! What differs between transports stays with them: reading and writing
//! messages, their deadlines, and how the kernel names the asker ([`Origin`]).
//! The order and checks of the messages themselves are
//! `metalift_xpc::exchange`'s (pure, shared with the shim's tests).
#![forbid(unsafe_code)]

use std::sync::Arc;

use metalift_policy::wire::{CheckIn, Declined, Message, VerdictMsg, WireError};
use metalift_xpc::exchange::{self, Refusal, Request, Sender, Serving};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::checkin::peer::{self, PeerFacts};
use crate::checkin::per_user::{user_share, UserLimit, UserPermit};
use crate::checkin::server::{Core, Counted, Refusing};

/// Who sent a message, as the transport's kernel names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The connection's one peer: a Unix socket's kernel names it once, at
    /// connect (`SO_PEERCRED`); every message on it is taken as that peer's.
    Connection,
    /// The process the kernel stamped on this very message (XPC's per-message
    /// audit token); `None`: the message carries no stamp.
    Message(Option<Sender>),
}

impl Origin {
    fn sender(self) -> Option<Sender> {
        match self {
            Origin::Connection => None,
            Origin::Message(sender) => sender,
        }
    }
}

/// A transport's places, shared by all its connections: every bound is per
/// user as well as global ([`crate::checkin::per_user`]), the user's share taken
/// first.
#[derive(Debug, Clone)]
pub struct Places {
    /// Check-ins being identified and decided (`Limits::max_active`).
    active: Arc<Semaphore>,
    /// Check-ins from admission to outcome (`Limits::max_waiting`).
    waiting: Arc<Semaphore>,
    /// Each uid's share of `active`.
    active_per_user: UserLimit,
    /// Each uid's share of `waiting`: one user's idle check-ins never make
    /// another user's `Busy`.
    waiting_per_user: UserLimit,
}

impl Places {
    /// `active` places (at least one) and `waiting` places (none: every
    /// check-in is declined busy).
    #[must_use]
    pub fn new(active: usize, waiting: usize) -> Places {
        let active = active.max(1);
        Places {
            active: Arc::new(Semaphore::new(active)),
            waiting: Arc::new(Semaphore::new(waiting)),
            active_per_user: UserLimit::new(user_share(active)),
            waiting_per_user: UserLimit::new(user_share(waiting)),
        }
    }

    /// Waiting places free now, over every user (for tests and status).
    #[must_use]
    pub fn waiting_free(&self) -> usize {
        self.waiting.available_permits()
    }

    /// A waiting place for `uid`: its share first, then a global one; `None`
    /// when either is full (the share given back at once).
    fn try_waiting(&self, uid: u32) -> Option<WaitingPlace> {
        let user = self.waiting_per_user.try_acquire(uid)?;
        let global = Arc::clone(&self.waiting).try_acquire_owned().ok()?;
        Some(WaitingPlace {
            _user: user,
            _global: global,
        })
    }
}

/// One waiting place, given back when dropped.
#[derive(Debug)]
struct WaitingPlace {
    _user: UserPermit,
    _global: OwnedSemaphorePermit,
}

/// An active place and its count in `metalift status`, given back when dropped.
#[derive(Debug)]
pub struct Active {
    _user: UserPermit,
    _global: OwnedSemaphorePermit,
    _counted: Counted,
}

/// What becomes of a connection's first message.
#[derive(Debug)]
pub enum Admission {
    /// Answer with [`Session::status`] (no waiting place, no identity needed).
    Status,
    /// Answer with this at once, and close: nothing is decided.
    Decline(Declined),
    /// Identify the asker and decide.
    Decide(Admitted),
}

/// An admitted check-in: its request and its waiting place.
#[derive(Debug)]
pub struct Admitted {
    req: CheckIn,
    place: WaitingPlace,
}

/// A check-in decided and about to be answered: it still holds its active place.
#[derive(Debug)]
#[must_use = "call `answered` once the verdict is sent"]
pub struct Answered {
    awaiting: Awaiting,
    active: Active,
}

impl Answered {
    /// The verdict was sent: the active place goes back; the waiting place is
    /// held until the outcome, and the connection counted as waiting.
    pub fn answered(self) -> Awaiting {
        drop(self.active);
        Awaiting {
            _waiting: Some(self.awaiting.session.core.count_waiting()),
            ..self.awaiting
        }
    }
}

/// An answered check-in waiting for its outcome; dropping it (silence, a
/// hang-up, shutdown) releases its place and leaves the decision without one.
#[derive(Debug)]
pub struct Awaiting {
    session: Session,
    /// The decision id sent in the verdict.
    given: u64,
    /// Who asked; without the executable's descriptor (the outcome record
    /// needs the pid and path only).
    facts: PeerFacts,
    /// How the kernel named the asker.
    asker: Origin,
    /// The check-in's job claim text, for the outcome's record.
    job: Option<String>,
    _place: WaitingPlace,
    _waiting: Option<Counted>,
}

/// The transport-independent steps of a check-in, for one transport. Cheap to
/// clone (shared handles inside).
#[derive(Debug, Clone)]
pub struct Session {
    core: Arc<Core>,
    places: Places,
    /// `unix` or `xpc`, in every record.
    transport: &'static str,
}

impl Session {
    /// The steps for `transport`, deciding with `core` within `places`.
    #[must_use]
    pub fn new(core: Arc<Core>, places: Places, transport: &'static str) -> Session {
        Session {
            core,
            places,
            transport,
        }
    }

    /// The core the steps call.
    #[must_use]
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The transport's places.
    #[must_use]
    pub fn places(&self) -> &Places {
        &self.places
    }

    /// The first message of a connection, from `origin`: a check-in or a status
    /// request. An outcome sent first (an attempt to put a report in the log for
    /// someone's decision) is refused and recorded; anything else is refused.
    pub fn first(
        &self,
        message: Result<Message, WireError>,
        origin: Origin,
    ) -> Result<Request, Refusal> {
        let early_outcome = match &message {
            Ok(Message::Outcome(o)) => Some(o.decision_id),
            _ => None,
        };
        let refusal = match exchange::first(message) {
            Ok(request) => return Ok(request),
            Err(refusal) => refusal,
        };
        if let Some(id) = early_outcome {
            self.record(
                &refusal,
                "outcome",
                origin,
                None,
                None,
                format!("an outcome for decision {id} on a connection that checked in for none"),
            );
        }
        Err(refusal)
    }

    /// Admits `request` from `uid`: `serving` says whether this transport
    /// decides check-ins at all. A check-in takes its waiting place here, so
    /// with none free (for this uid, or at all) it is declined as busy before
    /// anything is decided, and no decision ever loses its outcome for want of
    /// a place.
    #[must_use]
    pub fn admit(&self, request: Request, serving: Serving, uid: u32) -> Admission {
        let place = match &request {
            Request::CheckIn(_) if serving.declines().is_none() => self.places.try_waiting(uid),
            _ => None,
        };
        let free = place.is_some();
        match (exchange::admit(request, serving, free), place) {
            (exchange::Admission::Status, _) => Admission::Status,
            (exchange::Admission::Decline(declined), _) => Admission::Decline(declined),
            (exchange::Admission::Decide(req), Some(place)) => {
                Admission::Decide(Admitted { req, place })
            }
            // `admit` decides only with a place free.
            (exchange::Admission::Decide(_), None) => Admission::Decline(Declined {
                reason: metalift_policy::wire::DeclineReason::Busy,
                detail: "every place for a check-in awaiting its outcome is taken".into(),
            }),
        }
    }

    /// The status reply (counts only).
    pub fn status(&self) -> Result<Message, serde_json::Error> {
        Ok(Message::Status(serde_json::to_string(&self.core.status())?))
    }

    /// The token check failed: an admitted check-in whose message carries no
    /// stamp of its sender. Refused and recorded, its place released; the reply
    /// sends the shim to the socket, where the kernel names the connection.
    #[must_use]
    pub fn refuse_unstamped(&self, admitted: Admitted) -> Declined {
        drop(admitted);
        let refusal = Refusal::NoAuditToken;
        self.record(
            &refusal,
            "check_in",
            Origin::Message(None),
            None,
            None,
            refusal.to_string(),
        );
        Declined {
            reason: metalift_policy::wire::DeclineReason::UseSocket,
            detail: refusal.to_string(),
        }
    }

    /// Waits (holding no thread) for an active place, `uid`'s share first.
    /// `None` only if the places were closed, which nothing does.
    pub async fn activate(&self, uid: u32) -> Option<Active> {
        let user = self.places.active_per_user.acquire(uid).await;
        let global = Arc::clone(&self.places.active).acquire_owned().await.ok()?;
        Some(Active {
            _user: user,
            _global: global,
            _counted: self.core.count_active(),
        })
    }

    /// The kernel could not say who asked: counted (and, for a refusal such as
    /// a changed uid, recorded) by the core; the check-in closes unanswered.
    pub fn unidentified(&self, error: &peer::PeerError) {
        self.core.note_unidentified(error, self.transport);
    }

    /// Decides `admitted` for `facts` (the asker named by the kernel as
    /// `asker`) and records the decision; returns the verdict to send.
    pub async fn decide(
        &self,
        admitted: Admitted,
        facts: PeerFacts,
        asker: Origin,
        active: Active,
    ) -> (VerdictMsg, Answered) {
        let Admitted { req, place } = admitted;
        let job = req.job.clone();
        // Not raced against shutdown by any transport: a check-in that arrived
        // is decided, recorded and answered.
        let verdict = self.core.check_in(&facts, req, self.transport).await;
        let awaiting = Awaiting {
            session: self.clone(),
            given: verdict.decision_id,
            facts: PeerFacts {
                exe_file: None,
                ..facts
            },
            asker,
            job,
            _place: place,
            _waiting: None,
        };
        (verdict, Answered { awaiting, active })
    }

    /// The message after the verdict, from `origin`: its outcome is recorded,
    /// or it is refused and recorded. The waiting place is released either way.
    pub async fn outcome(
        &self,
        awaiting: Awaiting,
        message: Result<Message, WireError>,
        origin: Origin,
    ) -> Result<(), Refusal> {
        let checked = match awaiting.asker {
            Origin::Message(Some(asker)) => {
                exchange::outcome(message, origin.sender(), asker, awaiting.given)
            }
            // The connection is its one sender (or the asker was never
            // stamped, which `refuse_unstamped` already refused).
            Origin::Connection | Origin::Message(None) => {
                exchange::decided_outcome(message, awaiting.given)
            }
        };
        match checked {
            Ok(outcome) => {
                self.core
                    .outcome(&awaiting.facts, awaiting.job.as_deref(), outcome)
                    .await;
                Ok(())
            }
            Err(refusal) => {
                let detail = match (&refusal, origin.sender()) {
                    (Refusal::OtherProcess, Some(by)) => format!(
                        "{refusal}: sent by pid {} (version {}), the check-in came from pid {}",
                        by.pid, by.pid_version, awaiting.facts.pid
                    ),
                    _ => refusal.to_string(),
                };
                self.record(
                    &refusal,
                    "outcome",
                    origin,
                    Some(&awaiting.facts),
                    Some(awaiting.given),
                    detail,
                );
                Err(refusal)
            }
        }
    }

    /// Records `refusal` of a `message` (`check_in` or `outcome`) from
    /// `origin`, on a connection that checked in as `asker` (once identified)
    /// and was `given` a decision.
    fn record(
        &self,
        refusal: &Refusal,
        message: &'static str,
        origin: Origin,
        asker: Option<&PeerFacts>,
        given: Option<u64>,
        detail: String,
    ) {
        self.core.refuse(Refusing {
            message,
            reason: refusal.code(),
            detail,
            sender_pid: origin.sender().map(|s| s.pid),
            asker,
            // On a Unix socket the connection is the asker by construction.
            sent_by_asker: asker.is_some() && *refusal != Refusal::OtherProcess,
            decision_id: given,
            transport: self.transport,
        });
    }
}
