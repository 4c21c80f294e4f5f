//! The XPC transport (macOS): the mach service `com.metalift.policy` (configurable),
//! plugged into the same [`Core`] as the Unix socket.
//!
//! Like [`super::unix`], it only reads a message within its limits, learns the
//! asker from the kernel and hands both to the core: it decides and audits nothing
//! itself. A peer's steps are [`crate::checkin::session`]'s, in the order of
//! [`super::xpc_peer::serve`], which `daemon/tests/core_in_memory.rs` drives
//! with an in-memory link on any OS; `peer_task` is the libxpc link.
//!
//! # Messages
//!
//! Every message is an XPC dictionary holding one `data` value: the frame body of
//! `metalift_policy::wire`, the very bytes the Unix socket carries
//! (`metalift_xpc::frame`). A peer connection carries:
//!
//! - a `check_in` sent with a reply handler → the reply is the `verdict`; then
//!   optionally one `outcome` (sent without reply); or the reply is `declined`
//!   (use the socket, or busy: see below) and nothing is decided; or
//! - a `status_request` with a reply handler → `status` (counts only).
//!
//! A message refused (an outcome from another process or for another decision, a
//! malformed one, one without its own audit token) is recorded by the core
//! ([`Core::refuse`]) and closes the connection. An older shim's dictionary (one
//! key per field) is answered "declined: use the socket" in that layout and
//! logged, not decided (`metalift_xpc::frame`, "Older peers").
//!
//! # Who is asking
//!
//! The audit token of each *message* (`xpc_dictionary_get_audit_token`, private,
//! resolved with `dlsym`), never `xpc_connection_get_pid` nor the connection's
//! token (`xpc_connection_get_audit_token` is the sender of the last message
//! received, not necessarily this one's). A message without its own token is
//! refused and recorded. The outcome must come from the same process (pid and pid
//! version) as the check-in.
//!
//! # Serving or sending to the socket
//!
//! Under launchd metaliftd always claims its mach service: launchd keeps the port
//! for a job's `MachServices` either way, so a shim whose daemon does not listen
//! would wait out its whole deadline and never see an error. When the daemon
//! cannot identify XPC callers (started with `--no-xpc`, or on a macOS without the
//! per-message token) it still listens, and answers each check-in at once with
//! `Declined(UseSocket)`; the shim checks in on the socket within the same
//! deadline. The choice is `metalift_xpc::exchange::Serving`, tested on Linux.
//!
//! # Threads
//!
//! libxpc calls the handlers on dispatch queues. They never block and never touch
//! the runtime: they retain the message, read its token and `try_send` it into a
//! bounded tokio channel; a tokio task per peer does the rest. Replies are sent
//! from that task (`xpc_connection_send_message` is safe from any thread).
//!
//! # Panics
//!
//! Both handlers (listener and peer) run inside
//! [`crate::macos::panic_boundary::callback`]: a panic is
//! logged and the event dropped (a peer is then closed), never unwound into
//! libdispatch. The daemon hands libxpc/libdispatch no other callback: replies
//! are sent without reply handlers, and nothing is `dispatch_async`ed.
//!
//! # Limits
//!
//! - Peers that have not sent their first message yet, each for at most
//!   [`Limits::first_frame_timeout`], are charged to their euid
//!   (`xpc_connection_get_euid`) at the door ([`super::door`]): one euid holds
//!   at most a quarter of [`Limits::max_pending`]; its peer beyond that takes
//!   the place of its own oldest silent peer, which is cancelled (that shim
//!   sees an XPC error before any reply and checks in on the socket); no
//!   euid's peer is cancelled for another's below the hard cap.
//! - [`Limits::max_waiting`] places: a check-in takes one when it is admitted and
//!   gives it back when its outcome arrives or [`Limits::outcome_idle`] (seconds)
//!   has passed. With every place taken a check-in is answered at once with
//!   `Declined(Busy)`, never silently cancelled.
//! - [`Limits::max_active`] check-ins are identified and decided at once.
//! - A peer may queue at most [`PEER_QUEUE`] messages; more are dropped.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use block2::RcBlock;
use dispatch2::DispatchQueue;
use tokio::sync::{broadcast, mpsc};

use super::door::{Door, Pass};
use super::Limits;
use crate::checkin::server::Core;
use crate::checkin::session::{Places, Session};
use crate::macos::audit_token::AuditToken;
use crate::macos::panic_boundary;
use metalift_xpc::exchange::Serving;
use metalift_xpc::frame;
use metalift_xpc::message::XpcMessage;
use metalift_xpc::sys::{
    _xpc_error_connection_interrupted, _xpc_error_connection_invalid, _xpc_error_key_description,
    _xpc_error_termination_imminent, _xpc_type_connection, _xpc_type_dictionary, _xpc_type_error,
    audit_token_t, xpc_connection_activate, xpc_connection_cancel,
    xpc_connection_create_mach_service, xpc_connection_get_euid, xpc_connection_send_message,
    xpc_connection_set_event_handler, xpc_connection_t, xpc_dictionary_get_string, xpc_get_type,
    xpc_object_t, xpc_release, xpc_retain, PrivateXpc, XPC_CONNECTION_MACH_SERVICE_LISTENER,
};

mod peer_task;
use peer_task::PeerTask;

/// The transport's name in audit records.
pub const TRANSPORT: &str = "xpc";
/// The mach service metaliftd's launchd plists advertise (`MachServices`).
pub const DEFAULT_SERVICE: &str = frame::DEFAULT_SERVICE;
/// Messages a peer may have queued before further ones are dropped.
pub use super::xpc_peer::PEER_QUEUE;

/// Why the XPC listener could not start. The Unix socket is unaffected.
#[derive(Debug, thiserror::Error)]
pub enum XpcError {
    /// The service name cannot be a C string.
    #[error("mach service name {0:?} contains a NUL byte")]
    BadName(String),
    /// libxpc returned no listener object.
    #[error("cannot create a listener for the mach service {0}")]
    Listener(String),
}

/// Serves the mach service `service` until `shutdown` resolves, then waits for
/// every peer task to finish (in-flight check-ins are answered). With
/// `identities` false (`--no-xpc`), or on a macOS without the per-message audit
/// token, every check-in is answered `Declined(UseSocket)` at once.
///
/// The service must be in the `MachServices` of the launchd job running metaliftd;
/// otherwise libxpc reports `XPC_ERROR_CONNECTION_INVALID` to the listener (logged)
/// and no peer ever arrives.
pub async fn run(
    service: &str,
    core: Arc<Core>,
    limits: Limits,
    identities: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), XpcError> {
    let name = CString::new(service).map_err(|_| XpcError::BadName(service.to_owned()))?;
    let private = PrivateXpc::load();
    let serving = Serving::new(identities, private.dictionary_get_audit_token.is_some());
    if let Some(why) = serving.declines() {
        tracing::warn!(
            service,
            why,
            "XPC check-ins are answered \"use the socket\"; the Unix socket decides them"
        );
    }

    // Unbounded: every peer in it holds a pass, so the door bounds it, per
    // euid; a bounded queue would cancel one euid's peer for another's flood.
    let (accepted_tx, mut accepted_rx) = mpsc::unbounded_channel::<Accepted>();
    let stopping = Arc::new(AtomicBool::new(false));
    let listener_ctx = ListenerCtx {
        accepted: accepted_tx,
        door: Door::new(&limits),
        private,
        stopping: Arc::clone(&stopping),
        declining: serving.declines().is_some(),
    };
    let queue = DispatchQueue::new("com.metalift.policy.xpc", None);
    let listener = listen(&name, &queue, listener_ctx)
        .ok_or_else(|| XpcError::Listener(service.to_owned()))?;
    tracing::info!(service, "listening on the XPC mach service");

    let (notify_shutdown, _) = broadcast::channel::<()>(1);
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    // Each bound per user as well as global (crate::checkin::per_user); at
    // least one waiting place (XPC peers hold no descriptor of the fd budget).
    let session = Session::new(
        core,
        Places::new(limits.max_active, limits.max_waiting.max(1)),
        TRANSPORT,
    );
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = accepted_rx.recv() => {
                let Some(accepted) = accepted else { break };
                let task = PeerTask {
                    session: session.clone(),
                    limits,
                    serving,
                    shutdown: notify_shutdown.subscribe(),
                    _done: done_tx.clone(),
                };
                tokio::spawn(async move {
                    if let Err(error) = task.serve(accepted).await {
                        tracing::info!(%error, "XPC peer closed");
                    }
                });
            }
            () = &mut shutdown => {
                tracing::info!(service, "shutting down: no new XPC peers");
                break;
            }
        }
    }
    stopping.store(true, Ordering::Relaxed);
    drop(listener); // cancels the listener: no new peers
    drop(accepted_rx); // peers accepted but not yet served are cancelled
    drop(notify_shutdown);
    drop(done_tx);
    let _ = done_rx.recv().await;
    drop(queue);
    Ok(())
}

/// Creates and activates the listener on `queue`, its handler owning `ctx`.
/// Synchronous on purpose: no raw pointer or block lives across an await in [`run`].
fn listen(name: &CStr, queue: &DispatchQueue, ctx: ListenerCtx) -> Option<Connection> {
    let queue_ptr = (queue as *const DispatchQueue).cast_mut().cast();
    // SAFETY: NUL-terminated name; `queue` is a live dispatch queue (retained by the
    // connection); the flag asks for a listener. Returns a +1 reference.
    let raw = unsafe {
        xpc_connection_create_mach_service(
            name.as_ptr(),
            queue_ptr,
            XPC_CONNECTION_MACH_SERVICE_LISTENER,
        )
    };
    if raw.is_null() {
        return None;
    }
    let listener = Connection(raw);
    let handler = RcBlock::new(move |event: xpc_object_t| {
        panic_boundary::callback("XPC listener event handler", (), || {
            on_listener_event(event, &ctx);
        });
    });
    // SAFETY: `listener` is live and not yet active; libxpc copies the block.
    unsafe { xpc_connection_set_event_handler(listener.0, &handler) };
    // SAFETY: the handler is set; activation starts delivering peers.
    unsafe { xpc_connection_activate(listener.0) };
    Some(listener)
}

/// One +1 reference to a connection; dropping it cancels the connection.
#[derive(Debug)]
struct Connection(xpc_connection_t);

// SAFETY: libxpc connections may be used from any thread or queue (the send and
// cancel functions are documented as safe to call from multiple queues).
unsafe impl Send for Connection {}

impl Connection {
    /// Sends `message` (logically copied by libxpc).
    fn send(&self, message: &XpcMessage) {
        // SAFETY: both objects are live references we hold.
        unsafe { xpc_connection_send_message(self.0, message.as_raw()) }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: a live, activated connection; cancelling twice is harmless.
        unsafe { xpc_connection_cancel(self.0) };
        // SAFETY: our +1 reference, released exactly once.
        unsafe { xpc_release(self.0) };
    }
}

/// What the listener's handler needs; lives inside the handler block.
struct ListenerCtx {
    /// Hands accepted peers to the tokio side (never blocks a queue).
    accepted: mpsc::UnboundedSender<Accepted>,
    /// Peers that have not sent their first message yet, per euid
    /// ([`Limits::max_pending`], [`super::door`]).
    door: Door,
    /// The private audit-token function.
    private: PrivateXpc,
    /// Set before the listener is cancelled, so its final "invalid" is not an error.
    stopping: Arc<AtomicBool>,
    /// Check-ins are sent to the socket: a listener without a launchd job
    /// (`metaliftd --no-xpc` run by hand) is expected, not an error.
    declining: bool,
}

/// A peer connection, active, with the channel its handler feeds.
struct Accepted {
    peer: Connection,
    events: mpsc::Receiver<PeerEvent>,
    /// Its place at the door, given back with the first message.
    pending: Pass,
}

/// What a peer connection's handler forwards.
enum PeerEvent {
    /// A dictionary, with the audit token the kernel attached to it (`None`: no
    /// per-message token could be read).
    Message {
        dict: XpcMessage,
        token: Option<AuditToken>,
    },
    /// The connection was interrupted, invalidated or cancelled.
    Closed,
}

/// On the listener's dispatch queue: a new peer, or a listener error.
fn on_listener_event(event: xpc_object_t, ctx: &ListenerCtx) {
    // SAFETY: libxpc passes a live object for the duration of the handler.
    let kind = unsafe { xpc_get_type(event) };
    if kind == &raw const _xpc_type_connection {
        accept(event, ctx);
    } else if kind == &raw const _xpc_type_error {
        if ctx.stopping.load(Ordering::Relaxed) {
            tracing::debug!("XPC listener cancelled");
        } else if event == error_object(&raw const _xpc_error_connection_invalid) && ctx.declining {
            tracing::info!("no XPC listener (not started by launchd?): the Unix socket serves");
        } else if event == error_object(&raw const _xpc_error_connection_invalid) {
            tracing::error!(
                "the XPC listener is invalid: is the service in this job's MachServices?"
            );
        } else {
            tracing::warn!(error = %describe_error(event), "XPC listener error");
        }
    }
}

/// Sets up a peer connection and hands it to the tokio side (past its euid's
/// share, in place of that euid's oldest silent peer), or cancels it when the
/// door is full and no euid holds two more than its own ([`super::door`]).
fn accept(conn: xpc_connection_t, ctx: &ListenerCtx) {
    // SAFETY: `conn` is the live peer handed to this handler; the euid is the
    // one libxpc read from the peer's audit token when it connected.
    let euid = unsafe { xpc_connection_get_euid(conn) };
    let pending = match ctx.door.enter(euid) {
        Ok(pass) => pass,
        Err(refused) => {
            // Debug only: one line per refused peer would let a flood fill the log.
            tracing::debug!(%refused, "XPC peer cancelled at the door (it falls back to the socket)");
            // SAFETY: an unwanted peer may simply be cancelled; libxpc disposes of it.
            unsafe { xpc_connection_cancel(conn) };
            return;
        }
    };
    let (events_tx, events) = mpsc::channel(PEER_QUEUE);
    let private = ctx.private;
    let handler = RcBlock::new(move |event: xpc_object_t| {
        let delivered = panic_boundary::callback("XPC peer event handler", false, || {
            on_peer_event(event, private, &events_tx);
            true
        });
        if !delivered {
            // The event is lost: end this peer now rather than at its deadline.
            let _ = events_tx.try_send(PeerEvent::Closed);
        }
    });
    // SAFETY: `conn` is the live peer handed to this handler; libxpc copies the block.
    unsafe { xpc_connection_set_event_handler(conn, &handler) };
    // SAFETY: `conn` is live; this reference is ours until `Connection` drops.
    let peer = Connection(unsafe { xpc_retain(conn) });
    // SAFETY: the handler is set; activation starts delivering its messages.
    unsafe { xpc_connection_activate(conn) };
    let accepted = Accepted {
        peer,
        events,
        pending,
    };
    if ctx.accepted.send(accepted).is_err() {
        tracing::debug!("XPC listener stopping: cancelling a new peer");
        // Dropping `accepted` cancels the connection.
    }
}

/// On a peer's dispatch queue: forward a message with its audit token, or the end.
fn on_peer_event(event: xpc_object_t, private: PrivateXpc, events: &mpsc::Sender<PeerEvent>) {
    // SAFETY: libxpc passes a live object for the duration of the handler.
    let kind = unsafe { xpc_get_type(event) };
    if kind == &raw const _xpc_type_dictionary {
        let token = message_audit_token(event, private);
        // SAFETY: `event` is the live object this handler was called with.
        let Some(dict) = (unsafe { XpcMessage::retain_if_dictionary(event) }) else {
            return;
        };
        if events.try_send(PeerEvent::Message { dict, token }).is_err() {
            tracing::debug!("XPC peer floods: message dropped");
        }
    } else if kind == &raw const _xpc_type_error {
        let _ = events.try_send(PeerEvent::Closed);
    }
}

/// The audit token the kernel attached to `message` itself. `None` without the
/// per-message function, or when libxpc had no token (all zeros): never the
/// connection's token, which names the sender of *a* recent message.
fn message_audit_token(message: xpc_object_t, private: PrivateXpc) -> Option<AuditToken> {
    let get = private.dictionary_get_audit_token?;
    let mut raw = audit_token_t::default();
    // SAFETY: `message` is the live received dictionary; `raw` is writable.
    unsafe { get(message, &mut raw) };
    (raw != audit_token_t::default()).then_some(AuditToken::from_raw(raw))
}

/// `XPC_ERROR_*` global as the object pointer handlers receive.
fn error_object(e: *const metalift_xpc::sys::XpcDictionaryS) -> xpc_object_t {
    e.cast_mut().cast()
}

/// A readable name for an XPC error object.
fn describe_error(event: xpc_object_t) -> String {
    if event == error_object(&raw const _xpc_error_connection_interrupted) {
        return "connection interrupted".into();
    }
    if event == error_object(&raw const _xpc_error_connection_invalid) {
        return "connection invalid".into();
    }
    if event == error_object(&raw const _xpc_error_termination_imminent) {
        return "termination imminent".into();
    }
    // SAFETY: reading an immutable libxpc global (a pointer to a C string).
    let key = unsafe { _xpc_error_key_description };
    // SAFETY: `event` is a live error dictionary; `key` is NUL-terminated.
    let text = unsafe { xpc_dictionary_get_string(event, key) };
    if text.is_null() {
        return "unknown XPC error".into();
    }
    // SAFETY: libxpc returned a NUL-terminated string owned by `event`, alive here.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// `run` may be spawned on a multi-threaded runtime: its future must stay `Send`
/// (checked by `cargo check --all-targets --target aarch64-apple-darwin`).
#[cfg(test)]
#[allow(dead_code)]
fn run_is_send(core: Arc<Core>) {
    fn assert_send<T: Send>(_: T) {}
    assert_send(run(
        "x",
        core,
        Limits::default(),
        true,
        std::future::pending(),
    ));
}
