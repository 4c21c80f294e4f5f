//! What one XPC peer connection may say, and in which order: the only logic the
//! XPC transport has of its own. Pure, so `daemon/tests/core_in_memory.rs` runs
//! this very code against the real core on Linux.
//!
//! A connection is one of two exchanges, as on the Unix socket:
//!
//! - a check-in → the verdict, then at most one outcome, which must come from the
//!   same process (pid *and* pid version, from the kernel's per-message audit
//!   tokens) and name the decision given on this connection (or 0);
//! - a status request → the status.
//!
//! Before anything is decided, [`admit`] says whether this daemon will decide a
//! check-in at all: one that cannot tell XPC callers apart ([`Serving`]) answers
//! every check-in at once with "use the socket", and one whose places are all
//! taken answers "busy" — replies the shim understands, never a silent cancel.
//!
//! Anything else closes the connection without reaching the core; the transport
//! records each refusal ([`Refusal::code`]).
#![forbid(unsafe_code)]

use metalift_policy::wire::{CheckIn, DeclineReason, Declined, Message, Outcome, WireError};

/// The sender of one message, as the kernel's audit token names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    /// Process id.
    pub pid: u32,
    /// Pid version: changes at every exec and pid reuse.
    pub pid_version: u32,
}

/// What the first message asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Decide (the transport identifies the sender and calls `Core::check_in`).
    CheckIn(CheckIn),
    /// Counts only (`Core::status`).
    Status,
}

/// Why a connection is closed without (further) answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The message's frame (or its absence) is not a valid message.
    #[error("bad message: {0}")]
    Wire(#[from] WireError),
    /// A valid message at the wrong point of the exchange.
    #[error("unexpected {0} message")]
    Unexpected(&'static str),
    /// The outcome names another decision than the one given here.
    #[error("outcome for decision {got}, but this connection was given {given}")]
    WrongDecision {
        /// The id in the outcome.
        got: u64,
        /// The id of the verdict sent on this connection.
        given: u64,
    },
    /// The outcome comes from another process than the check-in did.
    #[error("outcome sent by another process than the check-in")]
    OtherProcess,
    /// The message carries no per-message audit token: the kernel did not say who
    /// sent it, and the connection's token names only *a* recent message's sender.
    #[error("message without a per-message audit token")]
    NoAuditToken,
}

impl Refusal {
    /// One word for the audit record's `reason`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Wire(_) => "malformed",
            Refusal::Unexpected(_) => "unexpected",
            Refusal::WrongDecision { .. } => "wrong_decision",
            Refusal::OtherProcess => "other_process",
            Refusal::NoAuditToken => "no_audit_token",
        }
    }
}

/// Whether this daemon identifies XPC callers, or sends them to the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// XPC is on and libxpc stamps each message with its sender's audit token.
    Identities,
    /// Started with `--no-xpc`: the mach service is claimed (launchd keeps the port
    /// either way) only to send each check-in to the socket at once.
    SocketOnly,
    /// This macOS has no per-message audit-token function: a caller cannot be
    /// told apart from whoever sent the connection's last message.
    NoMessageToken,
}

impl Serving {
    /// What a daemon with XPC `enabled` (no `--no-xpc`) serves, given whether
    /// libxpc has the per-message audit-token function.
    #[must_use]
    pub fn new(enabled: bool, per_message_token: bool) -> Serving {
        match (enabled, per_message_token) {
            (false, _) => Serving::SocketOnly,
            (true, false) => Serving::NoMessageToken,
            (true, true) => Serving::Identities,
        }
    }

    /// Why check-ins are sent to the socket; `None` when they are decided here.
    #[must_use]
    pub fn declines(self) -> Option<&'static str> {
        match self {
            Serving::Identities => None,
            Serving::SocketOnly => Some("metaliftd serves no XPC check-ins (--no-xpc)"),
            Serving::NoMessageToken => {
                Some("this macOS gives metaliftd no per-message audit token for XPC")
            }
        }
    }
}

/// What becomes of a connection's first message.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Identify the sender and decide. The transport holds one of its places for
    /// this connection until the outcome arrives or the outcome wait ends.
    Decide(CheckIn),
    /// Answer with the status (counts only: no place, no identity needed).
    Status,
    /// Answer at once with this, and close.
    Decline(Declined),
}

/// Admits a connection's first `request`: `serving` says whether this daemon
/// decides XPC check-ins at all, `place_free` whether one of its places for
/// connections awaiting an outcome was free for this one.
#[must_use]
pub fn admit(request: Request, serving: Serving, place_free: bool) -> Admission {
    match request {
        Request::Status => Admission::Status,
        Request::CheckIn(_) if serving.declines().is_some() => Admission::Decline(Declined {
            reason: DeclineReason::UseSocket,
            detail: serving.declines().unwrap_or_default().to_owned(),
        }),
        Request::CheckIn(_) if !place_free => Admission::Decline(Declined {
            reason: DeclineReason::Busy,
            detail: "every place for a check-in awaiting its outcome is taken".to_owned(),
        }),
        Request::CheckIn(req) => Admission::Decide(req),
    }
}

/// The sender of a message, which must carry its own audit token (`None`: it did
/// not, and is refused).
pub fn sender(token: Option<Sender>) -> Result<Sender, Refusal> {
    token.ok_or(Refusal::NoAuditToken)
}

/// The first message of a connection: a check-in or a status request.
pub fn first(message: Result<Message, WireError>) -> Result<Request, Refusal> {
    match message? {
        Message::CheckIn(req) => Ok(Request::CheckIn(req)),
        Message::StatusRequest => Ok(Request::Status),
        other => Err(Refusal::Unexpected(other.kind_name())),
    }
}

/// The message after a verdict `given` was sent to `asker`: only its outcome,
/// from `sender` (the message's own audit token; `None` if it had none).
pub fn outcome(
    message: Result<Message, WireError>,
    sender: Option<Sender>,
    asker: Sender,
    given: u64,
) -> Result<Outcome, Refusal> {
    if self::sender(sender)? != asker {
        return Err(Refusal::OtherProcess);
    }
    decided_outcome(message, given)
}

/// The message after a verdict `given` was sent, on a transport whose
/// connection names its one sender (a Unix socket): only its outcome, naming
/// `given` (or 0). [`outcome`] is this after the per-message sender check.
pub fn decided_outcome(
    message: Result<Message, WireError>,
    given: u64,
) -> Result<Outcome, Refusal> {
    match message? {
        Message::Outcome(o) if o.decision_id == 0 || o.decision_id == given => Ok(o),
        Message::Outcome(o) => Err(Refusal::WrongDecision {
            got: o.decision_id,
            given,
        }),
        other => Err(Refusal::Unexpected(other.kind_name())),
    }
}
