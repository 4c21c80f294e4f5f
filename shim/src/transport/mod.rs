//! How the shim reaches metaliftd: start a check-in without waiting, later await
//! the verdict against a deadline, then report the outcome.
//!
//! Each transport implements [`CheckIn`] for its connection type and offers a
//! `start` function; [`start_check_in`] picks one: on macOS XPC first
//! (`xpc.rs`, which itself falls back to the socket when no metalift mach service
//! exists, and is skipped when `METALIFT_SOCKET` names a daemon), the Unix socket
//! (`unix.rs`) everywhere else. The rest of the shim never learns which one answered.

use std::time::Instant;

use metalift_policy::wire::{self, Outcome, VerdictMsg};

use crate::config::Config;

mod unix;
#[cfg(target_os = "macos")]
mod xpc;

/// A check-in that has been sent and whose verdict has not been read yet.
pub(crate) trait CheckIn: Send {
    /// Waits until `deadline` at most for the daemon's verdict. `Err` carries the
    /// reason the process stays stock (timeout, closed connection, malformed frame).
    fn await_verdict(&mut self, deadline: Instant) -> Result<VerdictMsg, String>;

    /// Sends the outcome without waiting (best effort) and ends the conversation.
    fn report(self: Box<Self>, outcome: &Outcome);
}

/// Connects to the daemon and sends the check-in without waiting for an answer.
/// `Err` is the reason no verdict will come (no daemon, refused, ...).
pub(crate) fn start_check_in(config: &Config) -> Result<Box<dyn CheckIn>, String> {
    let hello = wire::Message::CheckIn(wire::CheckIn {
        shim_version: env!("CARGO_PKG_VERSION").to_owned(),
        arch: std::env::consts::ARCH.to_owned(),
        claimed_executable: std::env::current_exe()
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
    });
    #[cfg(target_os = "macos")]
    if let Ok(connection) = xpc::start(config, &hello) {
        return Ok(Box::new(connection));
    }
    let connection = unix::start(&config.socket, &wire::encode_frame(&hello))?;
    Ok(Box::new(connection))
}
