//! One daemon per audit log: metaliftd holds an exclusive `flock` on
//! `<log>.lock` beside the log for as long as it runs, so a second daemon
//! pointed at the same file refuses to start instead of interleaving its records.
//!
//! The lock is on a file beside the log, not on the log itself: rotation renames
//! the live file and opens a new one, and a lock on the renamed file would leave
//! the new one unguarded. The lock file holds the owner's pid (advisory, for the
//! message); the kernel drops the lock when the daemon exits, however it exits.
//! Other writers of the log (`metalift verify` appending its record) do not take
//! it: they append one record under `O_APPEND` and are not daemons.

use std::io;
use std::path::{Path, PathBuf};

use crate::holder_lock::{self, HolderLock};

/// The lock file for the audit log at `log`: `<log>.lock`.
#[must_use]
pub fn path_for(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it: another metaliftd writes this log.
    #[error(
        "another metaliftd{} writes the audit log {} (it holds {}): one daemon per audit log; \
         stop it, or give this one its own --audit-log",
        pid.map_or(String::new(), |p| format!(" (pid {p})")),
        log.display(),
        lock.display()
    )]
    Held {
        /// The log.
        log: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The holder's pid, as it wrote it.
        pid: Option<u32>,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock the audit log {} with {}: {source}", log.display(), lock.display())]
    Io {
        /// The log.
        log: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct LogLock {
    _held: HolderLock,
}

/// Takes the lock for the log at `log`, writing this process's pid into it.
pub fn acquire(log: &Path) -> Result<LogLock, LockError> {
    let lock = path_for(log);
    let io_err = |source| LockError::Io {
        log: log.to_owned(),
        lock: lock.clone(),
        source,
    };
    match holder_lock::try_take(&lock, 0o640, &std::process::id().to_string()).map_err(io_err)? {
        Ok(held) => Ok(LogLock { _held: held }),
        Err(busy) => Err(LockError::Held {
            log: log.to_owned(),
            lock: lock.clone(),
            pid: busy.holder.parse().ok(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_log_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        let first = acquire(&log).expect("the first daemon's lock");
        // flock locks belong to the open file description: a second open in this
        // process conflicts as another process's would.
        let err = acquire(&log).expect_err("a second daemon on the same log");
        let text = err.to_string();
        assert!(
            text.contains(&format!("(pid {})", std::process::id())),
            "{text}"
        );
        assert!(text.contains("one daemon per audit log"), "{text}");
        drop(first);
        acquire(&log).expect("free again once the first is gone");
    }
}
