//! The policy watcher: notices edits to `policy.toml` and `policy.d/` and reloads.
//!
//! # What is watched, and why
//!
//! Directories, never the file, each non-recursively:
//!
//! - the directory holding `policy.toml`: an editor's atomic save (write a temp
//!   file, rename it over), `ln -sfn` (a new link renamed over), a delete and a
//!   re-create all replace the file's inode, which a watch on the file itself would
//!   stop seeing after the first save. The creation of `policy.d/` shows here too.
//! - `policy.d/`, when it exists: fleet tools drop and remove files there.
//! - when `policy.toml` is a symlink, the directory of the file it finally points
//!   to: an edit of the target in place changes no link, so only that directory
//!   sees it.
//!
//! The set is recomputed after every batch of events and every few seconds, so a
//! `policy.d/` created after start, a re-pointed symlink or a directory deleted and
//! created again (whose old watch died with its inode) are picked up; when a
//! directory is (re)watched, the policy is reloaded in case an event was missed.
//!
//! Events are debounced: a reload runs once no event has arrived for `debounce`
//! (capped at [`MAX_BATCH`] from the first event, so a steady stream of writes cannot
//! starve reloads). Reading a file produces "opened" events on Linux; those are
//! ignored, or every reload would trigger the next. Any other event in a watched
//! directory triggers a reload; [`PolicyStore::reload`] makes an unchanged policy a
//! no-op, so events about unrelated files cost one load and nothing else.
//!
//! On Linux the backend is inotify, on macOS FSEvents (both via `notify`); if the
//! native backend cannot start (e.g. the inotify instance limit), polling every
//! [`POLL_INTERVAL`] takes over, and `tracing` says so.

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use crate::audit::AuditLog;
use crate::policy_store::{PolicyStore, ReloadOutcome};

/// The debounce metaliftd uses: editors finish an atomic save within a few
/// milliseconds, and 50 ms of quiet plus a load keeps an edit's way to the first
/// check-in that sees it under 100 ms.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(50);
/// The longest a batch of events may keep postponing its reload.
pub const MAX_BATCH: Duration = Duration::from_secs(1);
/// How often the set of watched directories is re-checked without any event.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(2);
/// The polling backend's interval, used only when the native one cannot start.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Starts watching the policy of `store` and reloading it on change, auditing to
/// `audit`, until `shutdown` completes.
///
/// `shutdown` is any future (as in mini-redis's `run(listener, shutdown)`): pass
/// `async move { let _ = rx.recv().await; }` for a broadcast receiver, or a
/// `CancellationToken`'s `cancelled_owned()`. The watches are in place when this
/// returns, so an edit made afterwards is never missed. Must be called inside a
/// tokio runtime. The task ends when `shutdown` completes.
pub fn spawn(
    store: Arc<PolicyStore>,
    audit: Arc<AuditLog>,
    debounce: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let (tx, rx) = mpsc::channel(64);
    let mut watches = Watches::new(store.path(), tx);
    watches.reconcile();
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown => {}
            () = run(store, audit, debounce, watches, rx) => {}
        }
        tracing::debug!("policy watcher stopped");
    })
}

async fn run(
    store: Arc<PolicyStore>,
    audit: Arc<AuditLog>,
    debounce: Duration,
    mut watches: Watches,
    mut rx: mpsc::Receiver<()>,
) {
    // Close the gap between the daemon's first load and the watches being in place.
    reload(&store, &audit).await;
    let mut recheck = tokio::time::interval(RECHECK_INTERVAL);
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
                settle(&mut rx, debounce).await;
                watches.reconcile();
                reload(&store, &audit).await;
            }
            _ = recheck.tick() => {
                if watches.reconcile() {
                    reload(&store, &audit).await;
                }
            }
        }
    }
}

/// Waits until no event has arrived for `debounce`, or [`MAX_BATCH`] has passed.
async fn settle(rx: &mut mpsc::Receiver<()>, debounce: Duration) {
    let cap = Instant::now() + MAX_BATCH;
    let mut deadline = (Instant::now() + debounce).min(cap);
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(()) => deadline = (Instant::now() + debounce).min(cap),
                None => return,
            },
            () = sleep_until(deadline) => return,
        }
    }
}

/// The fallback when the event source is gone: reload on a timer.
async fn poll_forever(store: &Arc<PolicyStore>, audit: &Arc<AuditLog>, watches: &mut Watches) {
    let mut tick = tokio::time::interval(RECHECK_INTERVAL);
    loop {
        tick.tick().await;
        watches.reconcile();
        reload(store, audit).await;
    }
}

/// Runs [`PolicyStore::reload`] off the async executor (it reads files).
async fn reload(store: &Arc<PolicyStore>, audit: &Arc<AuditLog>) {
    let (store, audit) = (Arc::clone(store), Arc::clone(audit));
    match tokio::task::spawn_blocking(move || store.reload(&audit)).await {
        Ok(ReloadOutcome::Unchanged) => {}
        Ok(outcome) => tracing::debug!(?outcome, "policy reloaded"),
        Err(error) => {
            tracing::error!(%error, "policy reload panicked; the last good policy stays live")
        }
    }
}

/// The directories being watched, and the backend watching them.
struct Watches {
    /// `policy.toml`.
    policy: PathBuf,
    backend: Box<dyn Watcher + Send>,
    /// Each watched directory with the (device, inode) it had when the watch was
    /// added: a different one now means the directory was replaced and the watch is dead.
    watched: Vec<(PathBuf, (u64, u64))>,
}

impl Watches {
    fn new(policy: &Path, tx: mpsc::Sender<()>) -> Watches {
        let policy_path = policy.to_owned();
        let handler = move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                Ok(event) => {
                    !is_read_only_access(&event.kind)
                        && (event.paths.is_empty()
                            || event.paths.iter().any(|p| concerns_policy(&policy_path, p)))
                }
                Err(error) => {
                    tracing::warn!(%error, "policy watcher event error; reloading to be safe");
                    true
                }
            };
            if relevant {
                // A full queue already holds a pending reload: dropping this one loses nothing.
                let _ = tx.try_send(());
            }
        };
        let backend: Box<dyn Watcher + Send> = match notify::recommended_watcher(handler.clone()) {
            Ok(w) => Box::new(w),
            Err(error) => {
                tracing::warn!(%error, "native file watching unavailable; polling every {POLL_INTERVAL:?}");
                let config = notify::Config::default().with_poll_interval(POLL_INTERVAL);
                match notify::PollWatcher::new(handler, config) {
                    Ok(w) => Box::new(w),
                    Err(error) => {
                        tracing::error!(%error, "no file watching at all; re-checking every {RECHECK_INTERVAL:?}");
                        Box::new(notify::NullWatcher)
                    }
                }
            }
        };
        Watches {
            policy: policy.to_owned(),
            backend,
            watched: Vec::new(),
        }
    }

    /// Makes the watched set match [`desired_dirs`]. Returns true when a directory
    /// was newly watched (events there may have been missed: reload).
    fn reconcile(&mut self) -> bool {
        let desired: Vec<(PathBuf, (u64, u64))> = desired_dirs(&self.policy)
            .into_iter()
            .filter_map(|dir| dir_id(&dir).map(|id| (dir, id)))
            .collect();
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
                    tracing::debug!(dir = %dir.display(), "watching");
                    self.watched.push((dir, id));
                    added = true;
                }
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "cannot watch; retrying every {RECHECK_INTERVAL:?}")
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

/// Whether a change at `changed` can change what `policy` loads: the policy file
/// itself (a write, or a rename or link swap onto its name), its symlink's target,
/// `policy.d/` or anything in it. Anything else in the watched directories (an
/// editor's temporary file, an audit log kept beside the policy) is ignored, so
/// its writes cannot keep postponing a reload.
fn concerns_policy(policy: &Path, changed: &Path) -> bool {
    let dropins = policy.with_file_name("policy.d");
    changed == policy
        || changed == dropins
        || changed.parent() == Some(dropins.as_path())
        || std::fs::canonicalize(policy).is_ok_and(|target| changed == target)
}

/// The directories to watch for `policy` (see the module doc), existing or not.
fn desired_dirs(policy: &Path) -> Vec<PathBuf> {
    let dir = match policy.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut dirs = vec![dir.join("policy.d"), dir.clone()];
    let is_link = std::fs::symlink_metadata(policy).is_ok_and(|m| m.file_type().is_symlink());
    if is_link {
        if let Some(target_dir) = std::fs::canonicalize(policy)
            .ok()
            .and_then(|t| t.parent().map(Path::to_path_buf))
        {
            let same_as_main = std::fs::canonicalize(&dir).is_ok_and(|d| d == target_dir);
            if !same_as_main {
                dirs.push(target_dir);
            }
        }
    }
    dirs
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
    fn only_the_policy_its_target_and_policy_d_concern_the_policy() {
        let policy = Path::new("/etc/metalift/policy.toml");
        assert!(concerns_policy(policy, policy));
        assert!(concerns_policy(policy, Path::new("/etc/metalift/policy.d")));
        assert!(concerns_policy(
            policy,
            Path::new("/etc/metalift/policy.d/10-fleet.toml")
        ));
        assert!(!concerns_policy(
            policy,
            Path::new("/etc/metalift/audit.jsonl")
        ));
        assert!(!concerns_policy(
            policy,
            Path::new("/etc/metalift/.policy.toml.swp")
        ));
    }

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

    #[test]
    fn a_symlinked_policy_adds_its_target_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let etc = tmp.path().join("etc");
        let store = tmp.path().join("store");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("p.toml"), "version = 1\n").unwrap();
        std::os::unix::fs::symlink(store.join("p.toml"), etc.join("policy.toml")).unwrap();
        let dirs = desired_dirs(&etc.join("policy.toml"));
        assert!(dirs.contains(&etc));
        assert!(dirs.contains(&etc.join("policy.d")));
        assert!(dirs.contains(&std::fs::canonicalize(&store).unwrap()));
    }
}
