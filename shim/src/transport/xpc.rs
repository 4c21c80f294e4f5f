//! The check-in over XPC (macOS), falling back to the Unix socket when no
//! metalift mach service can be found.
//!
//! # Which service
//!
//! `com.metalift.policy` (or `METALIFT_MACH_SERVICE`; like `METALIFT_SOCKET` it only
//! chooses whom to ask, so it cannot unlock anything). Looked up in this order:
//!
//! 1. a plain lookup: the per-user LaunchAgent (the default install) — and, through
//!    the bootstrap hierarchy, a system LaunchDaemon too;
//! 2. a privileged lookup (`XPC_CONNECTION_MACH_SERVICE_PRIVILEGED`): only the
//!    system bootstrap, for the LaunchDaemon variant where the first is refused
//!    (ssh sessions, sandboxed lookups);
//! 3. the Unix socket (`transport/unix.rs`), when both report
//!    `XPC_ERROR_CONNECTION_INVALID` ("not in this namespace"), or at once when a
//!    found service drops the connection before answering
//!    (`XPC_ERROR_CONNECTION_INTERRUPTED`: over its peer limit, or stopping).
//!
//! With `METALIFT_SOCKET` set, XPC is not tried at all: the admin named a daemon.
//!
//! # Never past the deadline
//!
//! The constructor creates the connection and sends the check-in with
//! `xpc_connection_send_message_with_reply` (asynchronous; libxpc looks the service
//! up lazily). The reply handler — on a libdispatch thread — stores the result in a
//! mutex and signals a condvar; on `CONNECTION_INVALID` it moves to the next step
//! above right there, so the socket fallback is sent at load time too, not at the
//! first device init. [`XpcCheckIn::await_verdict`] only waits on the condvar,
//! bounded by the deadline (`xpc_connection_send_message_with_reply_sync` has no
//! timeout, so it is never used).
//!
//! The dictionary layout and the libxpc declarations come from the
//! `metalift-xpc` crate, which the daemon's listener uses too: one mapping for
//! both ends.

use std::cell::Cell;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use block2::RcBlock;
use metalift_policy::wire::{self, Message, Outcome, VerdictMsg};

use super::unix::{self, UnixCheckIn};
use super::CheckIn;
use crate::config::Config;

use metalift_xpc::dict as wire_dict;
use metalift_xpc::sys as xpc_sys;
use metalift_xpc::xpc_dict::XpcDict;
use xpc_sys::{
    _xpc_error_connection_interrupted, _xpc_error_connection_invalid, _xpc_type_dictionary,
    xpc_connection_activate, xpc_connection_cancel, xpc_connection_create_mach_service,
    xpc_connection_send_barrier, xpc_connection_send_message,
    xpc_connection_send_message_with_reply, xpc_connection_set_event_handler, xpc_connection_t,
    xpc_get_type, xpc_object_t, xpc_release, XpcDictionaryS,
    XPC_CONNECTION_MACH_SERVICE_PRIVILEGED,
};

/// The lookups tried in order, as `xpc_connection_create_mach_service` flags.
const LOOKUPS: [u64; 2] = [0, XPC_CONNECTION_MACH_SERVICE_PRIVILEGED];

/// A check-in sent over XPC (or, once XPC proved absent, over the socket).
pub(crate) struct XpcCheckIn {
    shared: Arc<Shared>,
    /// The process that created the connection. libxpc is not fork-safe: a forked
    /// child must neither wait on nor cancel its parent's connection.
    pid: u32,
}

/// What the reply handler and the waiting thread share.
struct Shared {
    /// The service name.
    service: CString,
    /// The check-in, ready to be sent again on the next lookup.
    hello: Message,
    /// For the fallback: the daemon's socket and the check-in as a frame.
    socket: PathBuf,
    /// Where the conversation stands; guarded for the condvar.
    progress: Mutex<Progress>,
    /// Signalled whenever `progress` leaves `Waiting`.
    ready: Condvar,
}

/// The state of the check-in.
enum Progress {
    /// Sent on `connection` with lookup number `attempt`; no answer yet.
    Waiting {
        connection: Connection,
        attempt: usize,
    },
    /// The daemon answered (or the connection failed) on `connection`.
    Answered {
        verdict: Result<VerdictMsg, String>,
        connection: Connection,
    },
    /// No metalift mach service here: the check-in went to the Unix socket.
    Socket(Result<UnixCheckIn, String>),
    /// The verdict was taken, or the check-in dropped: late events are ignored.
    Done,
}

/// One +1 reference to a client connection; dropping it cancels the connection.
struct Connection(xpc_connection_t);

// SAFETY: libxpc connections may be used and cancelled from any thread.
unsafe impl Send for Connection {}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: an activated connection we hold; cancelling twice is harmless.
        unsafe { xpc_connection_cancel(self.0) };
        // SAFETY: our +1 reference from create, released exactly once.
        unsafe { xpc_release(self.0) };
    }
}

/// Starts the check-in over XPC. `Err` means "use the socket instead" (only when
/// `METALIFT_SOCKET` is set or the service name is unusable).
pub(crate) fn start(config: &Config, hello: &Message) -> Result<XpcCheckIn, String> {
    if std::env::var_os("METALIFT_SOCKET").is_some() {
        return Err("METALIFT_SOCKET is set: not trying XPC".into());
    }
    let name = std::env::var("METALIFT_MACH_SERVICE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| wire_dict::DEFAULT_SERVICE.to_owned());
    let service = CString::new(name).map_err(|_| "METALIFT_MACH_SERVICE contains a NUL byte")?;
    let shared = Arc::new(Shared {
        service,
        hello: hello.clone(),
        socket: config.socket.clone(),
        progress: Mutex::new(Progress::Done),
        ready: Condvar::new(),
    });
    let mut progress = shared.lock();
    *progress = send(&shared, 0);
    drop(progress);
    Ok(XpcCheckIn {
        shared,
        pid: std::process::id(),
    })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Sends the check-in with lookup number `attempt`; the caller holds the lock and
/// stores the returned state.
fn send(shared: &Arc<Shared>, attempt: usize) -> Progress {
    let Some(&flags) = LOOKUPS.get(attempt) else {
        return Progress::Socket(unix::start(
            &shared.socket,
            &wire::encode_frame(&shared.hello),
        ));
    };
    // SAFETY: NUL-terminated name; NULL queue = libdispatch's default target queue.
    // Returns a +1 reference (the service is only looked up when a message is sent).
    let raw = unsafe {
        xpc_connection_create_mach_service(shared.service.as_ptr(), std::ptr::null_mut(), flags)
    };
    if raw.is_null() {
        return send(shared, attempt + 1);
    }
    let connection = Connection(raw);
    // Errors reach the reply handler too; the connection handler only has to exist.
    let events = RcBlock::new(|_event: xpc_object_t| {});
    // SAFETY: a live, not yet active connection; libxpc copies the block.
    unsafe { xpc_connection_set_event_handler(connection.0, &events) };
    // SAFETY: the handler is set.
    unsafe { xpc_connection_activate(connection.0) };

    let mut message = XpcDict::new();
    wire_dict::encode(&shared.hello, &mut message);
    let for_reply = Arc::clone(shared);
    let on_reply = RcBlock::new(move |reply: xpc_object_t| {
        ffi_boundary!((), on_reply(&for_reply, attempt, reply));
    });
    // SAFETY: live connection and dictionary; NULL reply queue = the connection's
    // target queue; libxpc copies the block and logically copies the message.
    unsafe {
        xpc_connection_send_message_with_reply(
            connection.0,
            message.as_raw(),
            std::ptr::null_mut(),
            &on_reply,
        )
    };
    Progress::Waiting {
        connection,
        attempt,
    }
}

/// On a libdispatch thread: the daemon's reply, or why there is none.
fn on_reply(shared: &Arc<Shared>, attempt: usize, reply: xpc_object_t) {
    let mut progress = shared.lock();
    if !matches!(&*progress, Progress::Waiting { attempt: current, .. } if *current == attempt) {
        return; // taken, dropped, or another attempt's
    }
    let Progress::Waiting { connection, .. } = std::mem::replace(&mut *progress, Progress::Done)
    else {
        return;
    };
    *progress = if reply == error_object(&raw const _xpc_error_connection_invalid) {
        // Not in this namespace: try the next lookup.
        drop(connection);
        send(shared, attempt + 1)
    } else if reply == error_object(&raw const _xpc_error_connection_interrupted) {
        // Found, but the daemon dropped us before answering (it refuses peers
        // beyond its limit, or it stopped): the socket is the other way in.
        drop(connection);
        send(shared, LOOKUPS.len())
    } else {
        Progress::Answered {
            verdict: read_verdict(reply),
            connection,
        }
    };
    drop(progress);
    shared.ready.notify_all();
}

/// The verdict in a reply (the live object the reply handler received), or why
/// there is none.
fn read_verdict(reply: xpc_object_t) -> Result<VerdictMsg, String> {
    if reply == error_object(&raw const _xpc_error_connection_interrupted) {
        return Err("the daemon went away before answering".into());
    }
    // SAFETY: libxpc passes a live object for the duration of the handler.
    if unsafe { xpc_get_type(reply) } != &raw const _xpc_type_dictionary {
        return Err("XPC error before the verdict".into());
    }
    // SAFETY: `reply` is the live object the reply handler was called with.
    let Some(reply) = (unsafe { XpcDict::retain_if_dictionary(reply) }) else {
        return Err("malformed verdict: too many keys".into());
    };
    match wire_dict::decode(&reply) {
        Ok(Message::Verdict(verdict)) => Ok(verdict),
        Ok(_) => Err("malformed verdict: not a verdict".into()),
        Err(e) => Err(format!("malformed verdict: {e}")),
    }
}

/// `XPC_ERROR_*` global as the object pointer handlers receive.
fn error_object(e: *const XpcDictionaryS) -> xpc_object_t {
    e.cast_mut().cast()
}

impl CheckIn for XpcCheckIn {
    fn await_verdict(&mut self, deadline: Instant) -> Result<VerdictMsg, String> {
        if self.pid != std::process::id() {
            return Err("forked child: the XPC check-in belongs to the parent process".into());
        }
        let mut progress = self.shared.lock();
        loop {
            match &mut *progress {
                Progress::Waiting { .. } => {}
                Progress::Answered { verdict, .. } => {
                    return std::mem::replace(verdict, Err("the verdict was already read".into()))
                }
                Progress::Socket(Ok(socket)) => return socket.await_verdict(deadline),
                Progress::Socket(Err(reason)) => {
                    return Err(format!(
                        "no metalift XPC service ({}) and {reason}",
                        self.shared.service.to_string_lossy()
                    ))
                }
                Progress::Done => return Err("the check-in was closed".into()),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("no verdict before the deadline".into());
            }
            progress = self
                .shared
                .ready
                .wait_timeout(progress, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    fn report(self: Box<Self>, outcome: &Outcome) {
        if self.pid != std::process::id() {
            return; // Drop leaves the parent's connection alone
        }
        let state = std::mem::replace(&mut *self.shared.lock(), Progress::Done);
        match state {
            Progress::Socket(Ok(socket)) => Box::new(socket).report(outcome),
            Progress::Answered { connection, .. } | Progress::Waiting { connection, .. } => {
                let mut message = XpcDict::new();
                wire_dict::encode(&Message::Outcome(outcome.clone()), &mut message);
                // SAFETY: live connection and dictionary (logically copied by libxpc).
                unsafe { xpc_connection_send_message(connection.0, message.as_raw()) };
                // Cancel only once the outcome has left (cancelling now would drop
                // it): the barrier block owns the connection and drops it when run,
                // or when libxpc releases the block.
                let raw = connection.0;
                let last = Cell::new(Some(connection));
                let close = RcBlock::new(move || drop(last.take()));
                // SAFETY: `raw` stays alive: its reference is inside `close`, which
                // libxpc copies before this returns.
                unsafe { xpc_connection_send_barrier(raw, &close) };
            }
            Progress::Socket(Err(_)) | Progress::Done => {}
        }
    }
}

impl Drop for XpcCheckIn {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // In a forked child: touch neither the lock (a parent thread may have
            // held it at fork) nor libxpc. Leaking one reference keeps `Shared`,
            // and so the connection, from ever being dropped here.
            std::mem::forget(Arc::clone(&self.shared));
            return;
        }
        // Late replies must not start a fallback for a check-in nobody reads.
        let state = std::mem::replace(&mut *self.shared.lock(), Progress::Done);
        drop(state);
    }
}
