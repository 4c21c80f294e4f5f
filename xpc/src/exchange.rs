//! What one XPC peer connection may say, and in which order: the only logic the
//! XPC transport has of its own. Pure, so `daemon/tests/core_in_memory.rs` runs
//! this very code (included by path) against the real core on Linux.
//!
//! A connection is one of two exchanges, as on the Unix socket:
//!
//! - a check-in → the verdict, then at most one outcome, which must come from the
//!   same process (pid *and* pid version, from the kernel's audit tokens) and name
//!   the decision given on this connection (or 0);
//! - a status request → the status.
//!
//! Anything else closes the connection without reaching the core.
#![forbid(unsafe_code)]

use metalift_policy::wire::{CheckIn, Message, Outcome, WireError};

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
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The dictionary is not a valid message.
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
}

/// The first message of a connection: a check-in or a status request.
pub fn first(message: Result<Message, WireError>) -> Result<Request, Refusal> {
    match message? {
        Message::CheckIn(req) => Ok(Request::CheckIn(req)),
        Message::StatusRequest => Ok(Request::Status),
        other => Err(Refusal::Unexpected(other.kind_name())),
    }
}

/// The message after a verdict `given` was sent to `asker`: only its outcome.
pub fn outcome(
    message: Result<Message, WireError>,
    sender: Sender,
    asker: Sender,
    given: u64,
) -> Result<Outcome, Refusal> {
    if sender != asker {
        return Err(Refusal::OtherProcess);
    }
    match message? {
        Message::Outcome(o) if o.decision_id == 0 || o.decision_id == given => Ok(o),
        Message::Outcome(o) => Err(Refusal::WrongDecision {
            got: o.decision_id,
            given,
        }),
        other => Err(Refusal::Unexpected(other.kind_name())),
    }
}
