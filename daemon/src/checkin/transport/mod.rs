//! Transports: how check-ins reach the [`Core`](crate::checkin::server::Core).
//!
//! Every transport does the same three things and nothing more: read a message
//! within its limits, learn the asker's identity from the kernel
//! ([`crate::checkin::peer`]), and hand both to the core, which decides and audits. So a
//! verdict is reached by one code path whichever way the shim asked.
//!
//! - [`door`]: connections not yet heard from, per uid, on both transports;
//! - [`unix`]: length-prefixed frames on a Unix socket (Linux, and the macOS fallback);
//!   [`socket_file`]: that socket's file, from creation to removal.
//! - `xpc` (macOS): the XPC mach service, plugged into the same core;
//!   [`xpc_peer`]: one XPC peer's exchange (any OS), behind a link to libxpc
//!   or to the tests' in-memory stand-in.
//!
//! The steps of a check-in between reading and answering are
//! [`crate::checkin::session`]'s, the same for every transport.
//!
//! metaliftd runs both on macOS (XPC first choice of the shim, the socket its
//! fallback), with one shutdown and one [`Core`](crate::checkin::server::Core).

use std::time::Duration;

pub mod door;
pub mod socket_file;
pub mod unix;
#[cfg(target_os = "macos")]
pub mod xpc;
pub mod xpc_peer;

/// Resource limits of a transport, so no client can starve the others.
///
/// A connection is *active* while it is being read or answered, and *waiting*
/// after its verdict, until the shim's outcome report, which libmetalift v4 sends
/// as soon as Metal's original `initGPUFamilySupport` returns (microseconds to
/// milliseconds after the verdict), or until [`Limits::outcome_idle`] passes. The
/// two are capped separately so that shims waiting to report can never take the
/// places of clients that are asking now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Accepted connections whose first frame has not arrived yet, all uids
    /// together; one uid holds at most a quarter of them, its newest ([`door`]). They hold
    /// no active place: a client that connects and says nothing costs one
    /// descriptor for at most `first_frame_timeout`, and one uid's thousands of
    /// them cannot stop the daemon from accepting another uid's check-in.
    pub max_pending: usize,
    /// How long after the accept the first frame must be complete (a shim sends
    /// its check-in right after `connect`; capped by `read_timeout`).
    pub first_frame_timeout: Duration,
    /// Connections being read or answered at once. Further clients queue in the
    /// listen backlog; each active one is bounded by `read_timeout`.
    pub max_active: usize,
    /// Check-ins from admission to their outcome report. A place is taken when a
    /// check-in is admitted, on either transport ([`crate::checkin::session`]);
    /// with none free (for its uid, or at all) it is answered `Declined(Busy)` at
    /// once and nothing is decided, so no decision loses its outcome for want of
    /// a place.
    pub max_waiting: usize,
    /// A frame must arrive complete within this long of the connection being
    /// accepted (the first frame) or of its first byte (later frames). This is the
    /// longest a slow or hostile client can hold an active place.
    pub read_timeout: Duration,
    /// How long an answered connection may stay silent before the outcome report
    /// starts. Seconds, not minutes: the shim checks in from inside Metal's device
    /// creation and reports when the original `initGPUFamilySupport` returns, so
    /// an honest outcome follows its verdict within milliseconds; the margin is
    /// for a loaded machine. A longer wait would only let idle peers hold places
    /// ([`Limits::max_waiting`]) that other processes need. A decision whose
    /// outcome does not come in time stays in the log without one (`metalift
    /// audit` shows "no outcome"; `--result no-outcome` selects it).
    pub outcome_idle: Duration,
}

impl Limits {
    /// The default [`Limits::outcome_idle`].
    pub const DEFAULT_OUTCOME_IDLE: Duration = Duration::from_secs(5);
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pending: 4096,
            first_frame_timeout: Duration::from_secs(1),
            max_active: 64,
            max_waiting: 1024,
            read_timeout: Duration::from_secs(5),
            outcome_idle: Limits::DEFAULT_OUTCOME_IDLE,
        }
    }
}
