//! The policy watcher: notices every way `policy.toml` and `policy.d/` get
//! replaced, and reloads within milliseconds.
//!
//! # What is watched, and why
//!
//! Directories, never files, each non-recursively: the directory of every entry
//! the kernel walks to reach the policy and `policy.d/` (see [`chain`]). So:
//!
//! - in-place writes, `cp` over: the file's own directory sees the write; the
//!   file is read only once its writer closes it ([`open_writes`]: inotify's
//!   `IN_CLOSE_WRITE` on Linux, the content change xnu reports at the close on
//!   macOS), so a slow writer's half-written file never goes live;
//! - editors' atomic saves (a temp file renamed over), vim's backup dance
//!   (rename away, write anew), `mv` over: the rename/create onto the name;
//! - `policy.d/` drops and removals: `policy.d/` itself is watched;
//! - a policy that is a symlink, whose target or any link of whose chain is
//!   swapped atomically (`ln -sfn`, Kubernetes' `..data`): each link's directory;
//! - a directory on the way deleted and created again: its parent is watched,
//!   and the new directory is watched as soon as it exists.
//!
//! After every batch of events the chain is walked again (a swapped link points
//! somewhere new) and the watches follow it; if a directory was newly watched,
//! the policy is reloaded in case an event was missed. A re-check every
//! [`RECHECK_INTERVAL`] does the same without events.
//!
//! Only events about entries of the chain (or `*.toml` in `policy.d/`) count, so
//! an audit log or an editor's swap file beside the policy costs nothing. Reading
//! a file produces "opened" events on Linux; those are ignored, or every reload
//! would trigger the next.
//!
//! Events are debounced briefly ([`DEFAULT_DEBOUNCE`]): a reload runs once no
//! relevant event has arrived for that long (capped at [`MAX_BATCH`] from the first
//! event, so a steady stream of writes cannot starve reloads). When the batch
//! leaves `policy.toml` missing, the watcher waits up to [`DELETE_GRACE`] for it to
//! come back before going empty: an editor's save that renames the old file away
//! before writing the new one must not make everything stock for a moment. Reloads
//! run on the blocking pool, one at a time; events during a reload coalesce into
//! one more reload.
//!
//! On Linux the backend is inotify, on macOS FSEvents (both via `notify`); if the
//! native backend cannot start (e.g. the inotify instance limit), polling every
//! [`POLL_INTERVAL`] takes over, and `tracing` says so.

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

mod chain;
mod open_writes;
#[cfg(test)]
mod seam_tests;

use self::chain::Chain;
use self::open_writes::{CloseSignal, OpenWrites};
use crate::audit::AuditLog;
use crate::live_policy::store::{PolicyStore, ReloadOutcome, Trigger};

/// The debounce metaliftd uses: an editor's atomic save is a few events within
/// a millisecond or two; 5 ms of quiet joins them without adding much to an
/// edit's way to the first check-in that sees it (the budget is 100 ms).
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(5);
/// How long a batch that leaves `policy.toml` missing waits for it to come back
/// before it is refused as missing (the last good policy stays live, status degraded).
pub const DELETE_GRACE: Duration = Duration::from_millis(150);
/// How long before the first load a change still makes the watcher read the
/// policy again at start (file-system timestamps can lag by a clock tick).
const STARTUP_MARGIN: Duration = Duration::from_secs(2);
/// How long a file being written in place (see [`open_writes`]) may go without
/// an event before it is read anyway: its writer may keep it open for good.
pub const OPEN_WRITE_GRACE: Duration = Duration::from_millis(500);
/// The longest a batch of events may keep postponing its reload.
pub const MAX_BATCH: Duration = Duration::from_secs(1);
/// How often the set of watched directories is re-checked without any event.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(2);
/// The polling backend's interval, used only when the native one cannot start.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Starts watching the policy of `store` and reloading it on change, auditing to
/// `audit`, with the clocks of `timing`, until `shutdown` completes.
///
/// `shutdown` is any future (as in mini-redis's `run(listener, shutdown)`): pass
/// `async move { let _ = rx.recv().await; }` for a broadcast receiver, or a
/// `CancellationToken`'s `cancelled_owned()`. The watches are in place and the
/// policy has been read once more when this returns (it blocks for that load),
/// so an edit made afterwards is never missed and is seen as an event. Must be
/// called inside a tokio runtime. The task ends when `shutdown` completes.
pub fn spawn(
    store: Arc<PolicyStore>,
    audit: Arc<AuditLog>,
    timing: Timing,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let (tx, rx) = mpsc::channel(64);
    let mut watches = Watches::new(store.path(), tx);
    watches.reconcile();
    // Close the gap between the daemon's first load and the watches being in
    // place, before returning: an edit made after this call is an event. Only
    // when something on the chain changed since shortly before that load (a
    // margin for coarse file-system timestamps): at boot nothing has, and a
    // second compile of a large policy would cost a moment of CPU and memory.
    let since = store.first_read_at() - STARTUP_MARGIN;
    let changed = watches
        .chain
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .changed_since(since);
    let first = if changed {
        // Blocking: one load, once, at start.
        store.reload_on(Trigger::Watch, &audit)
    } else {
        ReloadOutcome::Unchanged
    };
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown => {}
            () = run(store, audit, timing, watches, rx, first) => {}
        }
        tracing::debug!("policy watcher stopped");
    })
}

/// The watcher's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Quiet time after the last relevant event before reloading.
    pub debounce: Duration,
    /// How often the chain is walked again without any event. Tests set it to
    /// hours, so that only event handling can make a change live.
    pub recheck: Duration,
    /// How long a missing `policy.toml` may take to come back before the empty
    /// policy goes live ([`DELETE_GRACE`]).
    pub delete_grace: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            debounce: DEFAULT_DEBOUNCE,
            recheck: RECHECK_INTERVAL,
            delete_grace: DELETE_GRACE,
        }
    }
}

async fn run(
    store: Arc<PolicyStore>,
    audit: Arc<AuditLog>,
    timing: Timing,
    mut watches: Watches,
    mut rx: mpsc::Receiver<()>,
    first: ReloadOutcome,
) {
    if first == ReloadOutcome::Vanished {
        reload(&store, &audit, &mut rx, &mut watches, timing).await;
    }
    let mut recheck = tokio::time::interval_at(Instant::now() + timing.recheck, timing.recheck);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = rx.recv() => {
                if event.is_none() {
                    tracing::error!("policy watcher backend stopped; reloads now happen only every {RECHECK_INTERVAL:?}");
                    // Keep re-checking on the timer below: never stop reloading entirely.
                    poll_forever(&store, &audit, &mut watches).await;
                    return;
                }
                settle(&mut rx, timing.debounce, &watches.writers).await;
                watches.reconcile();
                reload(&store, &audit, &mut rx, &mut watches, timing).await;
            }
            _ = recheck.tick() => {
                if watches.reconcile() {
                    reload(&store, &audit, &mut rx, &mut watches, timing).await;
                }
                refresh_instance(&store, &audit).await;
            }
        }
    }
}

/// Waits until no event has arrived for `debounce` and no file of the policy is
/// being written in place, or [`MAX_BATCH`] has passed. A file still being
/// written is waited for until its writer closes it (that close is an event), or
/// until [`OPEN_WRITE_GRACE`] passes without events.
async fn settle(rx: &mut mpsc::Receiver<()>, debounce: Duration, writers: &OpenWrites) {
    let cap = Instant::now() + MAX_BATCH;
    let mut last_event = Instant::now();
    loop {
        let waiting_for_writer = writers.any();
        let quiet = if waiting_for_writer {
            OPEN_WRITE_GRACE
        } else {
            debounce
        };
        tokio::select! {
            event = rx.recv() => match event {
                Some(()) => last_event = Instant::now(),
                None => return,
            },
            () = sleep_until((last_event + quiet).min(cap)) => {
                if !writers.any() {
                    return;
                }
                // A writer that went quiet for the whole grace (or the batch cap):
                // it may hold the file open for good, so read what is there.
                if waiting_for_writer || Instant::now() >= cap {
                    tracing::debug!("a policy file stayed open for writing; reading it anyway");
                    writers.forget();
                    return;
                }
            }
        }
    }
}

/// Reloads; when that finds `policy.toml` missing, waits up to `delete_grace` for
/// it to come back (an editor's rename-away-then-write save), taking further
/// events in meanwhile, then reloads for good (a refusal, the last good policy
/// kept, if it is still missing).
async fn reload(
    store: &Arc<PolicyStore>,
    audit: &Arc<AuditLog>,
    rx: &mut mpsc::Receiver<()>,
    watches: &mut Watches,
    timing: Timing,
) {
    if reload_on(store, audit, Trigger::Watch).await != Some(ReloadOutcome::Vanished) {
        return;
    }
    let deadline = Instant::now() + timing.delete_grace;
    loop {
        tokio::select! {
            event = rx.recv() => {
                if event.is_none() {
                    break;
                }
                settle(rx, timing.debounce, &watches.writers).await;
                watches.reconcile();
                if reload_on(store, audit, Trigger::Watch).await != Some(ReloadOutcome::Vanished) {
                    return;
                }
            }
            () = sleep_until(deadline) => break,
        }
    }
    reload_on(store, audit, Trigger::Request).await;
}

/// The fallback when the event source is gone: reload on a timer.
async fn poll_forever(store: &Arc<PolicyStore>, audit: &Arc<AuditLog>, watches: &mut Watches) {
    let mut tick = tokio::time::interval(RECHECK_INTERVAL);
    loop {
        tick.tick().await;
        watches.reconcile();
        reload_on(store, audit, Trigger::Request).await;
    }
}

/// Reads the clone's name again (`instance` beside the policy,
/// [`crate::audit::host`]) off the async executor: at every re-check and reload.
async fn refresh_instance(store: &Arc<PolicyStore>, audit: &Arc<AuditLog>) {
    let path = crate::audit::host::instance_path(store.path());
    let audit = Arc::clone(audit);
    let _ = tokio::task::spawn_blocking(move || audit.refresh_instance(&path)).await;
}

/// Runs [`PolicyStore::reload_on`] off the async executor (it reads files and
/// compiles), then reads the clone's name again. `None` if it panicked.
async fn reload_on(
    store: &Arc<PolicyStore>,
    audit: &Arc<AuditLog>,
    trigger: Trigger,
) -> Option<ReloadOutcome> {
    let (store, audit) = (Arc::clone(store), Arc::clone(audit));
    let instance = crate::audit::host::instance_path(store.path());
    match tokio::task::spawn_blocking(move || {
        let outcome = store.reload_on(trigger, &audit);
        audit.refresh_instance(&instance);
        outcome
    })
    .await
    {
        Ok(outcome) => {
            if !matches!(outcome, ReloadOutcome::Unchanged | ReloadOutcome::Vanished) {
                tracing::debug!(?outcome, "policy reloaded");
            }
            Some(outcome)
        }
        Err(error) => {
            tracing::error!(%error, "policy reload panicked; the last good policy stays live");
            None
        }
    }
}

/// The directories being watched, and the backend watching them.
struct Watches {
    /// `policy.toml`.
    policy: PathBuf,
    backend: Box<dyn Watcher + Send>,
    /// The chain as last walked; the event handler reads it to judge relevance.
    chain: Arc<RwLock<Chain>>,
    /// Each watched directory with the (device, inode) it had when the watch was
    /// added: a different one now means the directory was replaced and the watch is dead.
    watched: Vec<(PathBuf, (u64, u64))>,
    /// Directories a watch failed on, already reported.
    unwatchable: std::collections::HashSet<PathBuf>,
    /// Policy files being written in place, for [`settle`].
    writers: Arc<OpenWrites>,
}

/// The backend's event handler: judges each event's relevance against the chain,
/// tells [`OpenWrites`] about writers, and wakes the watcher. The seam tests feed
/// synthetic events through (a macOS backend's, on Linux).
#[derive(Clone)]
struct EventSink {
    chain: Arc<RwLock<Chain>>,
    writers: Arc<OpenWrites>,
    tx: mpsc::Sender<()>,
}

impl EventSink {
    fn take(&self, event: notify::Result<notify::Event>) {
        let relevant = match &event {
            Ok(event) if event.need_rescan() => {
                // Events were lost (queue overflow), closes among them.
                self.writers.forget();
                true
            }
            Ok(event) => {
                !is_read_only_access(&event.kind)
                    && (event.paths.is_empty() || {
                        let chain = self.chain.read().unwrap_or_else(PoisonError::into_inner);
                        let mut concerns = false;
                        for p in event.paths.iter().filter(|p| chain.concerns(p)) {
                            self.writers.observe(&event.kind, p);
                            concerns = true;
                        }
                        concerns
                    })
            }
            Err(error) => {
                tracing::warn!(%error, "policy watcher event error; reloading to be safe");
                true
            }
        };
        if relevant {
            // A full queue already holds a pending reload: dropping this one loses nothing.
            let _ = self.tx.try_send(());
        }
    }
}

impl notify::EventHandler for EventSink {
    fn handle_event(&mut self, event: notify::Result<notify::Event>) {
        self.take(event);
    }
}

/// How the native backend of this platform says a writer is done.
const NATIVE_CLOSE_SIGNAL: CloseSignal = if cfg!(target_os = "linux") {
    CloseSignal::CloseWrite
} else if cfg!(target_os = "macos") {
    CloseSignal::ContentModified
} else {
    CloseSignal::None
};

impl Watches {
    fn new(policy: &Path, tx: mpsc::Sender<()>) -> Watches {
        Watches::with_backend(policy, tx, |sink| {
            match notify::recommended_watcher(sink.clone()) {
                Ok(w) => (Box::new(w) as Box<dyn Watcher + Send>, NATIVE_CLOSE_SIGNAL),
                Err(error) => {
                    tracing::warn!(%error, "native file watching unavailable; polling every {POLL_INTERVAL:?}");
                    let config = notify::Config::default().with_poll_interval(POLL_INTERVAL);
                    match notify::PollWatcher::new(sink, config) {
                        Ok(w) => (Box::new(w), CloseSignal::None),
                        Err(error) => {
                            tracing::error!(%error, "no file watching at all; re-checking every {RECHECK_INTERVAL:?}");
                            (Box::new(notify::NullWatcher), CloseSignal::None)
                        }
                    }
                }
            }
        })
    }

    /// Watches with the backend `start` makes from the event handler, and the
    /// [`CloseSignal`] that backend reports.
    fn with_backend(
        policy: &Path,
        tx: mpsc::Sender<()>,
        start: impl FnOnce(EventSink) -> (Box<dyn Watcher + Send>, CloseSignal),
    ) -> Watches {
        let chain = Arc::new(RwLock::new(Chain::resolve(policy)));
        let writers = Arc::new(OpenWrites::default());
        let sink = EventSink {
            chain: Arc::clone(&chain),
            writers: Arc::clone(&writers),
            tx,
        };
        let (backend, signal) = start(sink);
        writers.enable(signal);
        Watches {
            policy: policy.to_owned(),
            backend,
            chain,
            watched: Vec::new(),
            unwatchable: std::collections::HashSet::new(),
            writers,
        }
    }

    /// Walks the chain again and makes the watched set match it. Returns true
    /// when a directory was newly watched (events there may have been missed: reload).
    fn reconcile(&mut self) -> bool {
        let chain = Chain::resolve(&self.policy);
        let desired: Vec<(PathBuf, (u64, u64))> = chain
            .dirs
            .iter()
            .filter_map(|dir| dir_id(dir).map(|id| (dir.clone(), id)))
            .collect();
        // Relevance first: an event in a directory about to be watched is judged
        // against the new chain.
        *self.chain.write().unwrap_or_else(PoisonError::into_inner) = chain;
        let mut added = false;
        let stale: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|w| !desired.contains(w))
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in stale {
            // The watch may already be gone with its directory: nothing to undo then.
            let _ = self.backend.unwatch(&dir);
            self.watched.retain(|(d, _)| d != &dir);
        }
        for (dir, id) in desired {
            if self.watched.iter().any(|(d, _)| d == &dir) {
                continue;
            }
            match self.backend.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.unwatchable.remove(&dir);
                    tracing::debug!(dir = %dir.display(), "watching");
                    self.watched.push((dir, id));
                    added = true;
                }
                // One line per directory, not one per re-check.
                Err(error) if self.unwatchable.insert(dir.clone()) => {
                    tracing::warn!(dir = %dir.display(), %error, "cannot watch; retrying every {RECHECK_INTERVAL:?}")
                }
                Err(error) => {
                    tracing::debug!(dir = %dir.display(), %error, "still cannot watch")
                }
            }
        }
        added
    }
}

/// "Opened" and "closed without writing" events: a reload's own reads cause them.
fn is_read_only_access(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(access) if *access != AccessKind::Close(AccessMode::Write))
}

/// The (device, inode) of `dir` if it is a directory now.
fn dir_id(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir)
        .ok()
        .filter(std::fs::Metadata::is_dir)
        .map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use notify::event::{CreateKind, ModifyKind};

    use super::*;

    #[test]
    fn opening_a_file_is_not_a_change_but_closing_after_writing_is() {
        assert!(is_read_only_access(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(is_read_only_access(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(!is_read_only_access(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(!is_read_only_access(&EventKind::Create(CreateKind::File)));
        assert!(!is_read_only_access(&EventKind::Modify(ModifyKind::Any)));
    }
}
