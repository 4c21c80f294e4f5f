//! Forwarding the audit log to a syslog collector (`[audit.forward]` in the policy).
//!
//! The local log stays the record of truth and the queue: a thread of its own reads
//! records back from the file after they were written ([`source`]), frames them as
//! RFC 5424 messages ([`frame`]), sends them over TCP or TLS ([`conn`]), and saves a
//! durable cursor at most every [`cursor::SAVE_EVERY`] ([`cursor`]). The writer is
//! never touched: a verdict and its record never wait for a collector. The thread
//! polls the file, so nothing is shared with the writer: after a batch that took
//! everything there was, it waits [`POLL`] before looking again, so under load the
//! records of that wait go out as one batch (one read, one write to the socket)
//! instead of a batch of a few records per turn of the loop. It runs at a lower
//! scheduling priority than the verdict path ([`priority`]).
//!
//! - [`status`]: what `metalift status` shows of it (`forwarder`).
//! - [`send_queue`]: the kernel's unacknowledged bytes (what `audit flush` waits on).
//! - [`lag`]: how long the oldest record not yet sent has waited (the health
//!   cause `forward_behind`).

pub mod conn;
pub mod cursor;
pub mod frame;
pub mod head;
pub mod lag;
pub mod priority;
pub mod send_queue;
pub mod source;
pub mod status;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use metalift_policy::forward::Forward;

use crate::audit::{AuditLog, Record};
use crate::live_policy::store::PolicyStore;
use conn::Conn;
use cursor::SaveSchedule;
use source::{Batch, Gap, Source};
pub use status::ForwarderStatus;

/// How often a caught-up forwarder looks for new records: also how long records
/// wait to be batched together under load.
pub const POLL: Duration = Duration::from_millis(20);
/// At most this many bytes of records per write (one batch, the memory bound).
pub const BATCH_BYTES: usize = 256 * 1024;
/// Longest a stop spends sending what is left.
pub const STOP_DRAIN: Duration = Duration::from_millis(500);
/// Longest wait between reconnection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The forwarder, shared with `status`.
#[derive(Debug, Default)]
pub struct Shared {
    status: Mutex<ForwarderStatus>,
    stop: AtomicBool,
    /// The open connection's socket, for [`Shared::abort`]; `None` when not
    /// connected (a handle kept past its connection would keep the socket open).
    abort: Mutex<Option<std::net::TcpStream>>,
}

impl Shared {
    /// The forwarder now, for `metalift status`.
    #[must_use]
    pub fn status(&self) -> ForwarderStatus {
        self.lock().clone()
    }

    /// Asks the thread to stop (after its current write).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Shuts the connection down under a write that blocks (a collector that does
    /// not read, a write begun before [`Shared::stop`] and bounded only by
    /// [`conn::IO_TIMEOUT`]): the write fails at once, the thread sees the stop.
    /// What was not acknowledged is past the saved cursor and is sent again by
    /// the next start (at least once).
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
    let shared = Arc::new(Shared::default());
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
    backoff: Duration,
    retry_at: Instant,
    header: frame::Header,
    cursor_path: PathBuf,
    saves: SaveSchedule,
    /// The batch read from the log, reused (no allocation per batch).
    batch: Vec<u8>,
    /// The batch framed for the collector, reused.
    out: Vec<u8>,
    last_count: Instant,
    /// When the oldest byte not yet sent was first seen (the status's `behind_since`).
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
        backoff: Duration::from_millis(100),
        retry_at: Instant::now(),
        header: frame::Header::of_this_host(),
        cursor_path: cursor::path_for(audit.path()),
        saves: SaveSchedule::new(cursor::SAVE_EVERY),
        batch: Vec::new(),
        out: Vec::new(),
        last_count: Instant::now() - Duration::from_secs(10),
        lag: lag::Lag::default(),
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let wanted = store.current().policy.forward().cloned();
        if wanted != st.config {
            st.conn = None;
            shared.connected(None);
            st.backoff = Duration::from_millis(100);
            st.retry_at = Instant::now();
            *shared.lock() = ForwarderStatus::configured(wanted.as_ref());
            st.lag = lag::Lag::default();
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
            match Source::open(audit.path(), audit.rotation().keep, saved) {
                Ok((source, gaps)) => {
                    record_gaps(audit, &gaps);
                    st.source = Some(source);
                }
                // Tried again next round; meanwhile nothing is sent.
                Err(error) => note_error(shared, format!("opening the audit log: {error}")),
            }
        }
        let round = step(&mut st, &config, audit, shared);
        save_cursor(&mut st, false);
        if !matches!(round, Round::Sent { more: true }) {
            std::thread::sleep(POLL);
        }
    }
    drain(&mut st, audit, shared);
    save_cursor(&mut st, true);
    shared.connected(None);
}

/// At a stop, sends what the log holds now (the `daemon_stop` record among it)
/// while connected, for at most [`STOP_DRAIN`]: the daemon's own wait for this
/// reads `bytes_behind` from the status, which is as old as the last round. A
/// collector that does not read cannot hold the stop longer: each write may block
/// only until the deadline.
fn drain(st: &mut State, audit: &AuditLog, shared: &Shared) {
    let deadline = Instant::now() + STOP_DRAIN;
    while let Some(conn) = st.conn.as_ref() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_write_timeout(left).is_err() {
            return;
        }
        let Some(config) = st.config.clone() else {
            return;
        };
        if matches!(step(st, &config, audit, shared), Round::Idle) {
            return;
        }
    }
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

/// One round: pick up rotations, send one batch.
fn step(st: &mut State, config: &Forward, audit: &AuditLog, shared: &Shared) -> Round {
    let Some(source) = st.source.as_mut() else {
        return Round::Idle;
    };
    match source.rescan() {
        Ok(gaps) => record_gaps(audit, &gaps),
        // The files already held are still sent; the rescan is tried next round.
        Err(error) => note_error(shared, format!("looking for rotated audit files: {error}")),
    }
    let batch = match source.next_batch(BATCH_BYTES, &mut st.batch) {
        Ok(b) => b,
        Err(error) => {
            note_error(shared, format!("reading the audit log: {error}"));
            return Round::Idle;
        }
    };
    let behind = source.bytes_behind();
    st.lag.seen(behind, SystemTime::now());
    let count_now = behind == 0 || st.last_count.elapsed() > Duration::from_secs(1);
    let records_behind = count_now.then(|| {
        st.last_count = Instant::now();
        source.records_behind()
    });
    {
        let mut s = shared.lock();
        s.set_behind(behind, st.lag.since());
        if let Some(r) = records_behind {
            s.records_behind = r;
        }
        s.position = source.cursor();
        s.unacknowledged_bytes = st.conn.as_ref().and_then(|c| c.unacknowledged().ok());
    }
    if st.conn.as_ref().is_some_and(Conn::peer_closed) {
        st.conn = None;
        shared.connected(None);
        note_error(shared, format!("{} closed the connection", config.address));
    }
    let Batch::Lines { more } = batch else {
        return Round::Idle;
    };
    if st.conn.is_none() {
        if Instant::now() < st.retry_at {
            return Round::Idle;
        }
        match Conn::open(config) {
            Ok(c) => {
                shared.connected(Some(&c));
                st.conn = Some(c);
                st.backoff = Duration::from_millis(100);
                shared.lock().connected = true;
            }
            Err(error) => {
                note_error(shared, format!("{error:#}"));
                st.retry_at = Instant::now() + st.backoff;
                st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                return Round::Idle;
            }
        }
    }
    let now = SystemTime::now();
    st.out.clear();
    let mut records = 0u64;
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', &st.batch) {
        let line = &st.batch[start..end];
        start = end + 1;
        if !line.is_empty() {
            frame::push(&mut st.out, &st.header, line);
            records += 1;
        }
    }
    let Some(conn) = st.conn.as_mut() else {
        return Round::Idle;
    };
    if let Err(error) = conn.send(&st.out) {
        st.conn = None;
        shared.connected(None);
        note_error(shared, format!("sending to {}: {error}", config.address));
        st.retry_at = Instant::now() + st.backoff;
        return Round::Idle;
    }
    source.advance(&st.batch);
    st.lag.sent(st.batch.len() as u64);
    let behind = source.bytes_behind();
    st.lag.seen(behind, now);
    if let Some(c) = source.cursor() {
        st.saves.delivered(c);
    }
    let mut s = shared.lock();
    s.delivered_records += records;
    s.delivered_bytes += st.out.len() as u64;
    s.last_delivery_at = Some(crate::audit::rfc3339::format(now));
    s.position = source.cursor();
    s.set_behind(behind, st.lag.since());
    s.records_behind = s.records_behind.saturating_sub(records);
    s.unacknowledged_bytes = conn.unacknowledged().ok();
    Round::Sent { more }
}

fn note_error(shared: &Shared, error: String) {
    tracing::warn!(%error, "audit forwarding");
    let mut s = shared.lock();
    s.connected = false;
    s.last_error = Some(error);
    s.last_error_at = Some(crate::audit::rfc3339::format(SystemTime::now()));
}

fn record_gaps(audit: &AuditLog, gaps: &[Gap]) {
    for gap in gaps {
        tracing::error!(file = %gap.file, records = ?gap.records, "audit records rotated away before they were forwarded");
        let record = Record::ForwardGap {
            time: SystemTime::now(),
            file: gap.file.clone(),
            records: gap.records,
        };
        if let Err(error) = audit.append(&record) {
            tracing::error!(%error, "cannot record a forwarding gap");
        }
    }
}
