//! The XPC transport (macOS): the mach service `com.metalift.policy` (configurable),
//! plugged into the same [`Core`] as the Unix socket.
//!
//! Like [`super::unix`], it only reads a message within its limits, learns the
//! asker from the kernel and hands both to the core: it decides and audits nothing
//! itself (`daemon/tests/core_in_memory.rs` drives the core the same way).
//!
//! # Messages
//!
//! Every message is an XPC dictionary in the layout `metalift_xpc::dict`
//! documents (one key per field of the wire messages). A peer connection carries:
//!
//! - a `check_in` sent with a reply handler → the reply is the `verdict`; then
//!   optionally one `outcome` (sent without reply), or
//! - a `status_request` with a reply handler → `status` (counts only).
//!
//! # Who is asking
//!
//! The audit token of each *message* (`xpc_dictionary_get_audit_token`, private,
//! resolved with `dlsym`), never `xpc_connection_get_pid`: a pid read from the
//! connection can name a process that exec'd or replaced the sender since. Without
//! the per-message function the connection's token is read inside the connection's
//! own serial handler, right after the message. The outcome must come from the same
//! process (pid and pid version) as the check-in.
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
//! [`Limits::max_waiting`] caps open peer connections (a new one beyond it is
//! cancelled, and the shim falls back to the Unix socket), [`Limits::max_active`]
//! the check-ins being identified and decided at once, [`Limits::read_timeout`]
//! the wait for the first message and [`Limits::outcome_idle`] the wait for the
//! outcome. A peer may queue at most [`PEER_QUEUE`] messages; more are dropped.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use block2::RcBlock;
use dispatch2::DispatchQueue;
use metalift_policy::wire::Message;
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};

use super::Limits;
use crate::checkin::peer;
use crate::checkin::server::Core;
use crate::macos::audit_token::AuditToken;
use crate::macos::panic_boundary;
use metalift_xpc::dict as wire_dict;
use metalift_xpc::exchange::{self, Refusal, Request, Sender};
use metalift_xpc::sys::{
    _xpc_error_connection_interrupted, _xpc_error_connection_invalid, _xpc_error_key_description,
    _xpc_error_termination_imminent, _xpc_type_connection, _xpc_type_dictionary, _xpc_type_error,
    audit_token_t, xpc_connection_activate, xpc_connection_cancel,
    xpc_connection_create_mach_service, xpc_connection_send_message,
    xpc_connection_set_event_handler, xpc_connection_t, xpc_dictionary_get_string, xpc_get_type,
    xpc_object_t, xpc_release, xpc_retain, PrivateXpc, XPC_CONNECTION_MACH_SERVICE_LISTENER,
};
use metalift_xpc::xpc_dict::XpcDict;

/// The transport's name in audit records.
pub const TRANSPORT: &str = "xpc";
/// The mach service metaliftd's launchd plists advertise (`MachServices`).
pub const DEFAULT_SERVICE: &str = wire_dict::DEFAULT_SERVICE;
/// Messages a peer may have queued before further ones are dropped: a shim sends two.
pub const PEER_QUEUE: usize = 4;

/// Why the XPC listener could not start. The Unix socket is unaffected.
#[derive(Debug, thiserror::Error)]
pub enum XpcError {
    /// The service name cannot be a C string.
    #[error("mach service name {0:?} contains a NUL byte")]
    BadName(String),
    /// Neither private audit-token function exists: peers could not be identified.
    #[error("libxpc offers no audit token for messages on this macOS: XPC check-ins are disabled")]
    NoAuditToken,
    /// libxpc returned no listener object.
    #[error("cannot create a listener for the mach service {0}")]
    Listener(String),
}

/// Serves check-ins on the mach service `service` until `shutdown` resolves, then
/// waits for every peer task to finish (in-flight check-ins are answered).
///
/// The service must be in the `MachServices` of the launchd job running metaliftd;
/// otherwise libxpc reports `XPC_ERROR_CONNECTION_INVALID` to the listener (logged)
/// and no peer ever arrives.
pub async fn run(
    service: &str,
    core: Arc<Core>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), XpcError> {
    let name = CString::new(service).map_err(|_| XpcError::BadName(service.to_owned()))?;
    let private = PrivateXpc::load();
    if private.dictionary_get_audit_token.is_none() && private.connection_get_audit_token.is_none()
    {
        return Err(XpcError::NoAuditToken);
    }

    let (accepted_tx, mut accepted_rx) = mpsc::channel::<Accepted>(limits.max_active.max(1));
    let stopping = Arc::new(AtomicBool::new(false));
    let listener_ctx = ListenerCtx {
        accepted: accepted_tx,
        places: Arc::new(Semaphore::new(limits.max_waiting.max(1))),
        private,
        stopping: Arc::clone(&stopping),
    };
    let queue = DispatchQueue::new("com.metalift.policy.xpc", None);
    let listener = listen(&name, &queue, listener_ctx)
        .ok_or_else(|| XpcError::Listener(service.to_owned()))?;
    tracing::info!(service, "listening on the XPC mach service");

    let (notify_shutdown, _) = broadcast::channel::<()>(1);
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let active = Arc::new(Semaphore::new(limits.max_active.max(1)));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = accepted_rx.recv() => {
                let Some(accepted) = accepted else { break };
                let task = PeerTask {
                    core: Arc::clone(&core),
                    limits,
                    active: Arc::clone(&active),
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
    fn send(&self, message: &XpcDict) {
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
    /// Hands accepted peers to the tokio side; `try_send` only (never blocks a queue).
    accepted: mpsc::Sender<Accepted>,
    /// Places for open peer connections ([`Limits::max_waiting`]).
    places: Arc<Semaphore>,
    /// The private audit-token functions.
    private: PrivateXpc,
    /// Set before the listener is cancelled, so its final "invalid" is not an error.
    stopping: Arc<AtomicBool>,
}

/// A peer connection, active, with the channel its handler feeds.
struct Accepted {
    peer: Connection,
    events: mpsc::Receiver<PeerEvent>,
    /// Held for the connection's life: one of [`Limits::max_waiting`] places.
    _place: OwnedSemaphorePermit,
}

/// What a peer connection's handler forwards.
enum PeerEvent {
    /// A dictionary, with the audit token the kernel attached to it.
    Message { dict: XpcDict, token: AuditToken },
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
        } else if event == error_object(&raw const _xpc_error_connection_invalid) {
            tracing::error!(
                "the XPC listener is invalid: is the service in this job's MachServices?"
            );
        } else {
            tracing::warn!(error = %describe_error(event), "XPC listener error");
        }
    }
}

/// Sets up a peer connection and hands it to the tokio side, or refuses it.
fn accept(conn: xpc_connection_t, ctx: &ListenerCtx) {
    let Ok(place) = Arc::clone(&ctx.places).try_acquire_owned() else {
        tracing::warn!("too many open XPC peers: refusing one (it falls back to the socket)");
        // SAFETY: an unwanted peer may simply be cancelled; libxpc disposes of it.
        unsafe { xpc_connection_cancel(conn) };
        return;
    };
    let (events_tx, events) = mpsc::channel(PEER_QUEUE);
    let private = ctx.private;
    let handler = RcBlock::new(move |event: xpc_object_t| {
        let delivered = panic_boundary::callback("XPC peer event handler", false, || {
            on_peer_event(event, conn, private, &events_tx);
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
        _place: place,
    };
    if ctx.accepted.try_send(accepted).is_err() {
        tracing::warn!("XPC accept queue full: refusing a peer (it falls back to the socket)");
        // Dropping `accepted` cancels the connection.
    }
}

/// On a peer's dispatch queue: forward a message with its audit token, or the end.
/// `conn` stays valid for as long as libxpc may call this handler.
fn on_peer_event(
    event: xpc_object_t,
    conn: xpc_connection_t,
    private: PrivateXpc,
    events: &mpsc::Sender<PeerEvent>,
) {
    // SAFETY: libxpc passes a live object for the duration of the handler.
    let kind = unsafe { xpc_get_type(event) };
    if kind == &raw const _xpc_type_dictionary {
        let Some(token) = audit_token_of(event, conn, private) else {
            tracing::warn!("XPC message without an audit token: ignored");
            return;
        };
        // SAFETY: `event` is the live object this handler was called with.
        let Some(dict) = (unsafe { XpcDict::retain_if_dictionary(event) }) else {
            return;
        };
        if events.try_send(PeerEvent::Message { dict, token }).is_err() {
            tracing::debug!(pid = token.pid(), "XPC peer floods: message dropped");
        }
    } else if kind == &raw const _xpc_type_error {
        let _ = events.try_send(PeerEvent::Closed);
    }
}

/// The kernel's audit token for `message`, which `conn`'s handler is handling now.
fn audit_token_of(
    message: xpc_object_t,
    conn: xpc_connection_t,
    private: PrivateXpc,
) -> Option<AuditToken> {
    let mut raw = audit_token_t::default();
    if let Some(get) = private.dictionary_get_audit_token {
        // SAFETY: `message` is the live received dictionary; `raw` is writable.
        unsafe { get(message, &mut raw) };
    } else if let Some(get) = private.connection_get_audit_token {
        // SAFETY: `conn` is live while its handler runs; read inside that serial
        // handler, the connection's token is the one of the message being handled.
        unsafe { get(conn, &mut raw) };
    }
    // All zeros: libxpc had no token (not a message the kernel delivered).
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

/// Why a peer was closed early.
#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error("no message within the read deadline")]
    Deadline,
    #[error("silent for longer than the outcome idle limit")]
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
struct PeerTask {
    core: Arc<Core>,
    limits: Limits,
    /// Places for check-ins being identified and decided ([`Limits::max_active`]).
    active: Arc<Semaphore>,
    /// Wakes when the daemon stops.
    shutdown: broadcast::Receiver<()>,
    /// Held, never used: its drop tells [`run`] this peer is done.
    _done: mpsc::Sender<()>,
}

impl PeerTask {
    /// The exchange's order and checks are `metalift_xpc::exchange`'s; this only
    /// moves messages between libxpc and the core.
    async fn serve(mut self, mut accepted: Accepted) -> Result<(), PeerError> {
        let first = tokio::select! {
            event = tokio::time::timeout(self.limits.read_timeout, accepted.events.recv()) => {
                event.map_err(|_| PeerError::Deadline)?
            }
            _ = self.shutdown.recv() => return Ok(()),
        };
        let Some(PeerEvent::Message { dict, token }) = first else {
            return Ok(());
        };
        let request = exchange::first(wire_dict::decode(&dict))?;
        // A request sent without a reply handler cannot be answered: refuse it
        // before anything is decided or recorded.
        let mut answer = XpcDict::reply_to(&dict).ok_or(PeerError::NoReplyExpected)?;
        let req = match request {
            Request::Status => {
                let json = serde_json::to_string(&self.core.status())?;
                reply(&accepted.peer, &mut answer, &Message::Status(json));
                return Ok(());
            }
            Request::CheckIn(req) => req,
        };

        // Not raced against shutdown: a check-in that arrived is decided, recorded
        // and answered.
        let Ok(active) = Arc::clone(&self.active).acquire_owned().await else {
            return Ok(()); // never closed
        };
        // SecCode reads the executable: on the core's bounded blocking pool.
        let facts = self
            .core
            .blocking()
            .run(move || peer::facts_from_audit_token(token))
            .await??;
        let verdict = self.core.check_in(&facts, req, TRANSPORT).await;
        let given = verdict.decision_id;
        reply(&accepted.peer, &mut answer, &Message::Verdict(verdict));
        drop(active);

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
        let outcome = exchange::outcome(
            wire_dict::decode(&dict),
            sender(&sent_by),
            sender(&token),
            given,
        )?;
        self.core.outcome(&facts, outcome).await;
        Ok(())
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

/// `run` may be spawned on a multi-threaded runtime: its future must stay `Send`
/// (checked by `cargo check --all-targets --target aarch64-apple-darwin`).
#[cfg(test)]
#[allow(dead_code)]
fn run_is_send(core: Arc<Core>) {
    fn assert_send<T: Send>(_: T) {}
    assert_send(run("x", core, Limits::default(), std::future::pending()));
}
