//! Forwarding the audit log to a syslog collector (`[audit.forward]` in the policy).
//!
//! The local log stays the record of truth and the queue: a thread of its own reads
//! records back from the file after they were written ([`source`]), frames them as
//! RFC 5424 messages ([`frame`]), sends them over TCP, TLS or RELP ([`conn`],
//! [`relp`]; a batch's sending and what is learnt of delivery: `deliver.rs`), keeps what
//! was sent and is not yet known delivered ([`window`]: sent again when a
//! connection ends), and saves the delivered position as a durable cursor at most
//! every [`cursor::SAVE_EVERY`] ([`cursor`]). A verdict and its record never
//! wait for a collector. The one thing shared with the writer is [`gaps`]: each
//! batch is claimed there (one `fstat` under a mutex) before it is sent, so the
//! writer counts exactly what a rotation deletes unsent, as it deletes it. The
//! thread polls the file: after a batch that took
//! everything there was, it waits [`POLL`] before looking again, so under load the
//! records of that wait go out as one batch (one read, one write to the socket)
//! instead of a batch of a few records per turn of the loop. It runs at a lower
//! scheduling priority than the verdict path ([`priority`]).
//!
//! - [`status`]: what `metalift status` shows of it (`forwarder`).
//! - [`gaps`]: records rotation deletes unsent, counted by the writer (`forward_gap`).
//! - [`send_queue`]: the kernel's unacknowledged bytes (what `audit flush` waits on,
//!   and what tells the window what the collector's TCP stack has).
//! - [`backoff`]: when to try a collector again.
//! - [`lag`]: how long the oldest record not yet delivered has waited (the
//!   health cause `forward_behind`).

pub mod backoff;
pub mod conn;
mod count;
pub mod cursor;
mod deliver;
pub mod frame;
pub mod gaps;
pub mod head;
pub mod lag;
pub mod priority;
pub mod relp;
pub mod send_queue;
pub mod source;
pub mod status;
pub mod window;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use metalift_policy::forward::Forward;

use crate::audit::AuditLog;
use crate::live_policy::store::PolicyStore;
use backoff::Backoff;
pub use backoff::MAX_BACKOFF;
use conn::Conn;
use cursor::{Cursor, SaveSchedule};
use deliver::{check, close_ours, lost};
use gaps::Gaps;
use source::{Batch, Source};
pub use status::ForwarderStatus;
use window::Window;

/// How often a caught-up forwarder looks for new records: also how long records
/// wait to be batched together under load.
pub const POLL: Duration = Duration::from_millis(20);
/// At most this many bytes of records per write (one batch, the memory bound).
pub const BATCH_BYTES: usize = 256 * 1024;
/// Longest a stop spends sending what is left.
pub const STOP_DRAIN: Duration = Duration::from_millis(500);
/// Longest a change of collector waits for the old one's TCP stack to
/// acknowledge what was sent (the rest goes to the new one).
const SWITCH_WAIT: Duration = Duration::from_millis(200);

/// The forwarder, shared with `status`.
#[derive(Debug, Default)]
pub struct Shared {
    status: Mutex<ForwarderStatus>,
    stop: AtomicBool,
    /// The open connection's socket, for [`Shared::abort`]; `None` when not
    /// connected (a handle kept past its connection would keep the socket open).
    abort: Mutex<Option<std::net::TcpStream>>,
    /// The log's gap count and claimed position (`None` in a default `Shared`):
    /// `status` reads `bytes_behind` and the gap total there, not from the
    /// last round (which a write blocked on the collector holds up).
    gaps: Option<Arc<Gaps>>,
}

impl Shared {
    /// The forwarder now, for `metalift status`: `bytes_behind` from the log's
    /// files as they are now (right while a write to the collector blocks), and
    /// the records rotated away unsent.
    #[must_use]
    pub fn status(&self) -> ForwarderStatus {
        let mut status = self.lock().clone();
        if let (Some(gaps), true) = (&self.gaps, status.configured) {
            status.bytes_behind = gaps.bytes_behind();
            // What is not sent is not delivered either (the round's figure may be older).
            status.undelivered_bytes = status.undelivered_bytes.max(status.bytes_behind);
            status.gap_records = gaps.total();
        }
        status
    }

    /// Asks the thread to stop (after its current write).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Shuts the connection down under a write that blocks (a collector that does
    /// not read, a write begun before [`Shared::stop`] and bounded only by
    /// [`conn::IO_TIMEOUT`]): the write fails at once, the thread sees the stop.
    /// What was not delivered is past the saved cursor and is sent again by the
    /// next start (at least once).
    pub fn abort(&self) {
        let handle = self
            .abort
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(socket) = handle {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Keeps the abort handle in step with the thread's connection.
    fn connected(&self, conn: Option<&Conn>) {
        *self
            .abort
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            conn.and_then(|c| c.abort_handle().ok());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ForwarderStatus> {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Starts the forwarder thread for `audit`, configured by the live policy of `store`
/// (a reload that changes `[audit.forward]` applies at once: the thread reconnects).
pub fn spawn(
    store: Arc<PolicyStore>,
    audit: Arc<AuditLog>,
) -> std::io::Result<(Arc<Shared>, std::thread::JoinHandle<()>)> {
    // Counting from now: records the daemon writes before the thread runs are
    // owed to the collector too.
    audit
        .gaps()
        .set_forwarding(store.current().policy.forward().is_some());
    let shared = Arc::new(Shared {
        gaps: Some(Arc::clone(audit.gaps())),
        ..Shared::default()
    });
    let thread = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("audit-forward".into())
            .spawn(move || run(&store, &audit, &shared))?
    };
    Ok((shared, thread))
}

struct State {
    config: Option<Forward>,
    conn: Option<Conn>,
    source: Option<Source>,
    /// Sent on `conn` and not yet known delivered.
    window: Window,
    /// The delivered position last handed to `saves`.
    delivered: Option<Cursor>,
    backoff: Backoff,
    header: frame::Header,
    cursor_path: PathBuf,
    saves: SaveSchedule,
    /// The batch read from the log, reused (no allocation per batch).
    batch: Vec<u8>,
    /// The batch framed for the collector, reused.
    out: Vec<u8>,
    /// One record's RFC 5424 message (RELP frames each), reused.
    msg: Vec<u8>,
    last_count: Instant,
    /// When the oldest byte not yet delivered was first seen (the status's `behind_since`).
    lag: lag::Lag,
}

/// What one round did.
enum Round {
    /// Nothing sent: caught up, not connected, or failed.
    Idle,
    /// A batch sent; `more` when more was already waiting.
    Sent { more: bool },
}

fn run(store: &PolicyStore, audit: &AuditLog, shared: &Shared) {
    if let Err(error) = priority::lower_this_thread() {
        tracing::warn!(%error, "cannot lower the audit forwarder's scheduling priority");
    }
    let mut st = State {
        config: None,
        conn: None,
        source: None,
        window: Window::default(),
        delivered: None,
        backoff: Backoff::new(Instant::now()),
        header: frame::Header::of(&audit.host()),
        cursor_path: cursor::path_for(audit.path()),
        saves: SaveSchedule::new(cursor::SAVE_EVERY),
        batch: Vec::new(),
        out: Vec::new(),
        msg: Vec::new(),
        last_count: Instant::now() - Duration::from_secs(10),
        lag: lag::Lag::default(),
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let wanted = store.current().policy.forward().cloned();
        if wanted != st.config {
            close_ours(&mut st, shared, Instant::now() + SWITCH_WAIT);
            st.backoff = Backoff::new(Instant::now());
            *shared.lock() = ForwarderStatus::configured(wanted.as_ref());
            st.lag = lag::Lag::default();
            audit.gaps().set_forwarding(wanted.is_some());
            st.config = wanted;
        }
        let Some(config) = st.config.clone() else {
            save_cursor(&mut st, true);
            st.source = None;
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        if st.source.is_none() {
            let saved = match cursor::load(&st.cursor_path) {
                Ok(c) => c,
                Err(error) => {
                    tracing::error!(%error, "the forwarding cursor is unreadable: forwarding from the oldest file");
                    None
                }
            };
            match Source::open(
                audit.path(),
                audit.rotation().keep,
                saved,
                Arc::clone(audit.gaps()),
            ) {
                Ok((source, found)) => {
                    if !found {
                        tracing::warn!(
                            "the forwarding cursor's file is gone: forwarding from the oldest file \
                             (what it held unsent is in the forward_gap total when a forwarder was configured)"
                        );
                    }
                    st.source = Some(source);
                }
                // Tried again next round; meanwhile nothing is sent.
                Err(error) => note_error(shared, format!("opening the audit log: {error}")),
            }
        }
        // The clone's name may have been given since (the instance file).
        st.header = frame::Header::of(&audit.host());
        let round = step(&mut st, &config, shared);
        save_cursor(&mut st, false);
        if !matches!(round, Round::Sent { more: true }) {
            std::thread::sleep(POLL);
        }
    }
    let deadline = drain(&mut st, shared);
    close_ours(&mut st, shared, deadline);
    save_cursor(&mut st, true);
}

/// At a stop, sends what the log holds now (the `daemon_stop` record among it)
/// while connected, for at most [`STOP_DRAIN`]: the daemon's own wait for this
/// reads `bytes_behind` from the status, which is as old as the last round. A
/// collector that does not read cannot hold the stop longer: each write may block
/// only until the deadline. Returns the deadline (what is left of it is for the
/// collector to acknowledge what was sent, [`close_ours`]).
fn drain(st: &mut State, shared: &Shared) -> Instant {
    let deadline = Instant::now() + STOP_DRAIN;
    while let Some(conn) = st.conn.as_ref() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_write_timeout(left).is_err() {
            break;
        }
        let Some(config) = st.config.clone() else {
            break;
        };
        if matches!(step(st, &config, shared), Round::Idle) {
            break;
        }
    }
    deadline
}

/// Saves the delivered position if it is due (or, with `now`, whatever the time).
fn save_cursor(st: &mut State, now: bool) {
    let at = Instant::now();
    let due = if now {
        st.saves.take()
    } else {
        st.saves.due(at)
    };
    let Some(c) = due else { return };
    match cursor::save(&st.cursor_path, c) {
        Ok(()) => st.saves.saved(at, c),
        Err(error) => {
            tracing::error!(%error, path = %st.cursor_path.display(), "cannot save the forwarding cursor");
            // Retried next round (the interval still applies: no busy retry).
            st.saves.delivered(c);
            st.saves.saved(at, c);
        }
    }
}

/// One round: pick up rotations, learn what the collector has, send one batch.
fn step(st: &mut State, config: &Forward, shared: &Shared) -> Round {
    let Some(source) = st.source.as_mut() else {
        return Round::Idle;
    };
    match source.rescan() {
        Ok(()) => {}
        // The files already held are still sent; the rescan is tried next round.
        Err(error) => note_error(shared, format!("looking for rotated audit files: {error}")),
    }
    check(st, config, shared);
    let Some(source) = st.source.as_mut() else {
        return Round::Idle;
    };
    let batch = match source.next_batch(BATCH_BYTES, &mut st.batch) {
        Ok(b) => b,
        Err(error) => {
            note_error(shared, format!("reading the audit log: {error}"));
            return Round::Idle;
        }
    };
    let behind = source.bytes_behind();
    let undelivered = source.bytes_undelivered();
    if let Some(end) = source.end() {
        st.lag.seen(end, SystemTime::now());
    }
    st.lag.passed(|c| source.is_delivered(c));
    let count_now = behind == 0 || st.last_count.elapsed() > Duration::from_secs(1);
    let records_behind = count_now.then(|| {
        st.last_count = Instant::now();
        source.records_behind()
    });
    {
        let mut s = shared.lock();
        s.set_behind(behind, undelivered, st.lag.since());
        if let Some(r) = records_behind {
            s.records_behind = r;
        }
        s.position = source.sent_mark().map(|m| m.cursor);
        s.delivered_position = source.cursor();
    }
    let unacknowledged = deliver::unacknowledged(st);
    shared.lock().unacknowledged_bytes = unacknowledged;
    let Batch::Lines { more } = batch else {
        return Round::Idle;
    };
    if st.conn.is_none() {
        if !st.backoff.ready(Instant::now()) {
            return Round::Idle;
        }
        match Conn::open(config) {
            Ok(c) => {
                shared.connected(Some(&c));
                st.conn = Some(c);
                shared.lock().connected = true;
            }
            Err(error) => {
                note_error(shared, format!("{error:#}"));
                st.backoff.failed(Instant::now());
                return Round::Idle;
            }
        }
    }
    let now = SystemTime::now();
    let sent = match deliver::send(st, config) {
        Ok(sent) => sent,
        Err(error) => {
            lost(st, shared, error);
            return Round::Idle;
        }
    };
    let unacknowledged = deliver::unacknowledged(st);
    let Some(source) = st.source.as_ref() else {
        return Round::Idle;
    };
    let behind = source.bytes_behind();
    let undelivered = source.bytes_undelivered();
    let mut s = shared.lock();
    s.delivered_records += sent.records;
    s.delivered_bytes += sent.bytes;
    s.last_delivery_at = Some(crate::audit::rfc3339::format(now));
    s.position = source.sent_mark().map(|m| m.cursor);
    s.delivered_position = source.cursor();
    s.set_behind(behind, undelivered, st.lag.since());
    s.records_behind = s.records_behind.saturating_sub(sent.records);
    s.unacknowledged_bytes = unacknowledged;
    Round::Sent { more }
}

fn note_error(shared: &Shared, error: String) {
    tracing::warn!(%error, "audit forwarding");
    let mut s = shared.lock();
    s.connected = false;
    s.last_error = Some(error);
    s.last_error_at = Some(crate::audit::rfc3339::format(SystemTime::now()));
}
