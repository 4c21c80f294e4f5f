//! Policy texts the archive could not take yet, kept to be written again.
//!
//! An archive write fails for the reasons an audit write does (a full disk, most
//! often). Without a retry, `explain --live` and `--decision` would later find the
//! text missing and could only guess why; with it, the text is written once space
//! is back, and until then the daemon knows, and says, that its live policy was
//! never archived (`policy_archived` in its status). Retried at every reload and
//! every status request: cheap when nothing waits, and no timer to run.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::live_policy::archive;

/// At most this many texts wait for a retry (each is a whole policy); past it,
/// the oldest is given up, with an error in the log.
const KEEP: usize = 8;

/// A policy text the archive does not hold yet.
#[derive(Debug)]
pub struct Unarchived {
    /// The policy's hash, the archive's key.
    pub sha256: String,
    /// Its files, `(name, contents)` in load order.
    pub sources: Vec<(String, String)>,
}

/// The texts waiting for a retry, oldest first.
#[derive(Debug, Default)]
pub struct PendingArchives {
    /// A std `Mutex`: held only for the writes of a retry, never across an `.await`.
    pending: Mutex<Vec<Unarchived>>,
}

impl PendingArchives {
    /// Starts with `pending` (the first load's, if its write failed).
    #[must_use]
    pub fn new(pending: Option<Unarchived>) -> PendingArchives {
        PendingArchives {
            pending: Mutex::new(pending.into_iter().collect()),
        }
    }

    /// Keeps `text` for a retry (a policy that went live unarchived).
    pub fn keep(&self, text: Unarchived) {
        let mut list = self.lock();
        list.retain(|u| u.sha256 != text.sha256);
        list.push(text);
        if list.len() > KEEP {
            let gone = list.remove(0);
            tracing::error!(sha256 = %gone.sha256,
                "giving up archiving this policy: `explain --decision` cannot show its text");
        }
    }

    /// Whether the text of `sha256` still waits (was never archived).
    #[must_use]
    pub fn waiting(&self, sha256: &str) -> bool {
        self.lock().iter().any(|u| u.sha256 == sha256)
    }

    /// Writes every waiting text into the archive beside `audit_log`, keeping
    /// those that fail again.
    pub fn retry(&self, audit_log: &Path) {
        let mut list = self.lock();
        if list.is_empty() {
            return;
        }
        let dir = archive::dir_for(audit_log);
        list.retain(|u| match archive::store(&dir, &u.sha256, &u.sources) {
            Ok(()) => {
                tracing::info!(sha256 = %u.sha256, "policy text archived on retry");
                false
            }
            Err(error) => {
                tracing::debug!(sha256 = %u.sha256, %error, "policy archive retry failed");
                true
            }
        });
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Unarchived>> {
        // Entries are pushed and removed whole: a poisoned lock still holds a valid list.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_that_could_not_be_archived_is_written_by_the_retry_once_it_can_be() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("audit.jsonl");
        // A file where the archive directory goes: every write fails.
        std::fs::write(dir.path().join("policies"), "").expect("blocker");
        let sha = "a".repeat(64);
        let pending = PendingArchives::new(Some(Unarchived {
            sha256: sha.clone(),
            sources: vec![("policy.toml".into(), "version = 1\n".into())],
        }));
        pending.retry(&log);
        assert!(pending.waiting(&sha));

        std::fs::remove_file(dir.path().join("policies")).expect("unblock");
        pending.retry(&log);
        assert!(!pending.waiting(&sha));
        assert!(archive::load(&archive::dir_for(&log), &sha)
            .expect("readable")
            .is_some());
    }
}
