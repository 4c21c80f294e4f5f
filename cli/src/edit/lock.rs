//! The edit lock: one `metalift edit` at a time per policy, like visudo's. An
//! advisory `flock(2)` on a lock file beside the policy, which names its holder
//! so a second editor can be told who has it. The kernel drops the lock when the
//! holder exits, however it exits, so a crashed editor never leaves it stuck.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// A held edit lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct EditLock {
    /// Kept open: closing it releases the lock.
    _file: File,
    path: PathBuf,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another editor holds it.
    #[error("{policy} is being edited by {holder}; try again when that editor is closed")]
    Busy {
        /// The policy file.
        policy: String,
        /// Who holds the lock, as the holder wrote it.
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}: {source}{}", path.display(), sudo_hint(source))]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// "run with sudo" when the error is a permission problem.
fn sudo_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::PermissionDenied {
        " (the policy belongs to root: run with sudo)"
    } else {
        ""
    }
}

/// The lock file for `policy`: `.NAME.lock` in the policy's directory.
#[must_use]
pub fn lock_path(policy: &Path) -> PathBuf {
    let name = policy
        .file_name()
        .map_or_else(|| "policy.toml".into(), |n| n.to_string_lossy());
    policy
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(format!(".{name}.lock"))
}

impl EditLock {
    /// Takes the lock for `policy`. When another editor has it: `wait` blocks
    /// until it is free (after saying who has it on stderr); otherwise fails with
    /// [`LockError::Busy`] naming the holder.
    pub fn take(policy: &Path, wait: bool) -> Result<EditLock, LockError> {
        let path = lock_path(policy);
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_err)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim().to_owned();
                let holder = if holder.is_empty() {
                    "another metalift edit".to_owned()
                } else {
                    holder
                };
                if !wait {
                    return Err(LockError::Busy {
                        policy: policy.display().to_string(),
                        holder,
                    });
                }
                eprintln!(
                    "metalift: {} is being edited by {holder}; waiting for it (Ctrl-C to give up)",
                    policy.display()
                );
                flock(&file, FlockOperation::LockExclusive).map_err(|e| io_err(e.into()))?;
            }
            Err(e) => return Err(io_err(e.into())),
        }
        // Say who holds it, for the next editor.
        let who = format!(
            "pid {} ({}) since {}\n",
            std::process::id(),
            user_name(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        );
        file.set_len(0).map_err(io_err)?;
        file.seek(SeekFrom::Start(0)).map_err(io_err)?;
        file.write_all(who.as_bytes()).map_err(io_err)?;
        Ok(EditLock { _file: file, path })
    }

    /// The lock file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Who is editing: the user behind sudo when there is one.
fn user_name() -> String {
    ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| format!("uid {}", rustix::process::getuid().as_raw()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_editor_is_told_who_holds_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let policy = tmp.path().join("policy.toml");
        let held = EditLock::take(&policy, false).unwrap();
        assert_eq!(held.path(), tmp.path().join(".policy.toml.lock"));
        // flock locks belong to the open file description: a second open conflicts.
        let err = EditLock::take(&policy, false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(held);
        EditLock::take(&policy, false).expect("free again once dropped");
    }
}
