//! Policy files some process is writing in place right now.
//!
//! An in-place save (`cp` over, `echo > policy.toml`, an editor without backups)
//! truncates the file and then writes it, possibly in several `write`s with pauses
//! between them. Reading it in the middle gives half a policy: a refusal at best,
//! at worst a shorter policy that is valid and goes live for a moment (a truncated
//! file is valid TOML with no rules: everything stock). inotify says when the
//! writer is done (`IN_CLOSE_WRITE`), so on Linux the watcher waits for that close
//! before reading, as long as the writer keeps writing. FSEvents (macOS) and the
//! polling fallback report no closes: there the debounce alone applies, and this
//! set stays empty.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
use notify::EventKind;

/// The files of the policy written to since their last close-after-writing.
#[derive(Debug, Default)]
pub(super) struct OpenWrites {
    /// Whether the backend reports closes (inotify); without them nothing is tracked.
    reports_closes: AtomicBool,
    paths: Mutex<HashSet<PathBuf>>,
}

impl OpenWrites {
    /// Starts tracking: call once the backend is known to report closes.
    pub(super) fn enable(&self) {
        self.reports_closes.store(true, Ordering::Relaxed);
    }

    /// Takes one event about `path`, a file of the policy.
    pub(super) fn observe(&self, kind: &EventKind, path: &Path) {
        if !self.reports_closes.load(Ordering::Relaxed) {
            return;
        }
        let mut paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        match kind {
            // Written to (a truncate is a modification too): a close will follow.
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any) => {
                paths.insert(path.to_owned());
            }
            // Created by a process that holds it open (a close will follow) — but
            // not a symlink or a hard link to an existing file (`ln -s`, `ln`),
            // which nobody writes and so never closes.
            EventKind::Create(CreateKind::File | CreateKind::Any) if created_open(path) => {
                paths.insert(path.to_owned());
            }
            // Done writing, or the name now refers to another file (or none): what
            // a writer still does to the old file is not what the name shows.
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Remove(_)
            | EventKind::Modify(ModifyKind::Name(_)) => {
                paths.remove(path);
            }
            _ => {}
        }
    }

    /// Whether some file of the policy is being written in place.
    pub(super) fn any(&self) -> bool {
        !self
            .paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Forgets every writer: after waiting for one too long (it may hold the file
    /// open for good), or after an event queue overflow lost its close.
    pub(super) fn forget(&self) {
        self.paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Whether `path` is a new regular file with one name, as `open(O_CREAT)` makes.
fn created_open(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && m.nlink() == 1)
}

#[cfg(test)]
mod tests {
    use notify::event::{DataChange, RemoveKind, RenameMode};

    use super::*;

    #[test]
    fn a_write_is_open_until_its_close_and_a_rename_or_removal_ends_it() {
        let w = OpenWrites::default();
        let p = Path::new("/etc/metalift/policy.toml");
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        w.observe(&written, p);
        assert!(
            !w.any(),
            "nothing is tracked before the backend says it reports closes"
        );
        w.enable();
        w.observe(&written, p);
        assert!(w.any());
        w.observe(&EventKind::Access(AccessKind::Open(AccessMode::Any)), p);
        assert!(w.any(), "an open is not a close");
        w.observe(&EventKind::Access(AccessKind::Close(AccessMode::Read)), p);
        assert!(w.any(), "a reader's close is not the writer's");
        w.observe(&EventKind::Access(AccessKind::Close(AccessMode::Write)), p);
        assert!(!w.any());

        w.observe(&written, p);
        w.observe(&EventKind::Modify(ModifyKind::Name(RenameMode::From)), p);
        assert!(!w.any());
        w.observe(&written, p);
        w.observe(&EventKind::Remove(RemoveKind::File), p);
        assert!(!w.any());
        w.observe(&written, p);
        w.forget();
        assert!(!w.any());
    }

    #[test]
    fn a_created_file_is_open_but_a_new_symlink_or_hard_link_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let w = OpenWrites::default();
        w.enable();
        let created = EventKind::Create(CreateKind::File);

        let file = dir.path().join("policy.toml");
        std::fs::write(&file, "version = 1\n").unwrap();
        w.observe(&created, &file);
        assert!(w.any(), "a created file is open in its creator");
        w.forget();

        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        w.observe(&created, &link);
        assert!(!w.any(), "a symlink is never written, so never closed");

        let hard = dir.path().join("hard.toml");
        std::fs::hard_link(&file, &hard).unwrap();
        w.observe(&created, &hard);
        assert!(
            !w.any(),
            "a second name for an existing file is not a writer"
        );

        w.observe(&created, &dir.path().join("gone.toml"));
        assert!(!w.any(), "a file already gone again is not waited for");
    }
}
