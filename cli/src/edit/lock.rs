//! The edit lock: one `metalift edit` at a time per policy, like visudo's. A
//! [`holder_lock`] beside the policy, which names its holder so a second editor
//! can be told who has it. The kernel drops the lock when the
//! holder exits, however it exits, so a crashed editor never leaves it stuck.

use std::io;
use std::path::{Path, PathBuf};

use metalift_daemon::holder_lock::{self, HolderLock};

/// A held edit lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct EditLock {
    /// Released when dropped.
    _held: HolderLock,
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
        // Who holds it, for the next editor.
        let who = format!(
            "pid {} ({}) since {}",
            std::process::id(),
            user_name(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        );
        let held = match holder_lock::try_take(&path, 0o600, &who).map_err(io_err)? {
            Ok(held) => held,
            Err(busy) => {
                let holder = if busy.holder.is_empty() {
                    "another metalift edit".to_owned()
                } else {
                    busy.holder.clone()
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
                busy.wait(&who).map_err(io_err)?
            }
        };
        Ok(EditLock { _held: held, path })
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
