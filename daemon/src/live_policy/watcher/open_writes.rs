//! Policy files some process is writing in place right now.
//!
//! An in-place save (`cp` over, `echo > policy.toml`, an editor without backups)
//! truncates the file and then writes it, possibly in several `write`s with pauses
//! between them. Reading it in the middle gives half a policy: a refusal at best,
//! at worst a shorter policy that is valid and goes live for a moment (a truncated
//! file is valid TOML with no rules: everything stock). So the watcher waits for
//! the writer to be done before reading, as long as the writer keeps writing
//! ([`super::OPEN_WRITE_GRACE`] of quiet ends the wait). What says "done" depends
//! on the backend ([`CloseSignal`]):
//!
//! - inotify (Linux) reports the writer's close, `IN_CLOSE_WRITE`
//!   (`Access(Close(Write))`); each `write` is `IN_MODIFY` (`Modify(Data(Any))`).
//! - FSEvents (macOS) reports no close as such, but xnu emits the file's content
//!   change only there: `vn_close` (bsd/vfs/vfs_vnops.c) adds
//!   `FSE_CONTENT_MODIFIED` when the descriptor was written (`FWASWRITTEN`), and a
//!   `write` adds nothing. With file-level events notify passes it on as
//!   `kFSEventStreamEventFlagItemModified` → `Modify(Data(Content))`. What comes
//!   *before* the close is the open: `O_CREAT` of a new file (`ItemCreated` →
//!   `Create(File)`) or the `O_TRUNC` of an existing one, a size change through
//!   `vnode_setattr` (bsd/vfs/vfs_subr.c), which emits `FSE_STAT_CHANGED`
//!   (`ItemInodeMetaMod` → `Modify(Metadata(Any))`). Those start the wait; the
//!   content change ends it. (A `touch` is a `FSE_STAT_CHANGED` too, with no
//!   close after it: it is read after the grace.)
//! - The polling fallback reports neither: the debounce alone applies there, and
//!   this set stays empty.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};

use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, MetadataKind, ModifyKind};
use notify::EventKind;

/// How a backend says a writer is done with a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseSignal {
    /// Nothing says it (polling): writers are not tracked.
    None = 0,
    /// inotify: `IN_CLOSE_WRITE`, after `IN_MODIFY` for each write.
    CloseWrite = 1,
    /// FSEvents: the content change xnu emits at the writer's close, after the
    /// open's create or truncate.
    ContentModified = 2,
}

/// The files of the policy being written since their writer opened them.
#[derive(Debug, Default)]
pub(crate) struct OpenWrites {
    /// The backend's [`CloseSignal`], as its `u8`; `None` until [`OpenWrites::enable`].
    signal: AtomicU8,
    paths: Mutex<HashSet<PathBuf>>,
}

impl OpenWrites {
    /// Starts tracking: call once the backend is known and reports `signal`.
    pub(crate) fn enable(&self, signal: CloseSignal) {
        self.signal.store(signal as u8, Ordering::Relaxed);
    }

    fn signal(&self) -> CloseSignal {
        match self.signal.load(Ordering::Relaxed) {
            1 => CloseSignal::CloseWrite,
            2 => CloseSignal::ContentModified,
            _ => CloseSignal::None,
        }
    }

    /// Takes one event about `path`, a file of the policy.
    pub(crate) fn observe(&self, kind: &EventKind, path: &Path) {
        let signal = self.signal();
        if signal == CloseSignal::None {
            return;
        }
        let mut paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        match (signal, kind) {
            // Gone, or the name now refers to another file: what a writer still
            // does to the old file is not what the name shows.
            (_, EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))) => {
                paths.remove(path);
            }
            // Created by a process that holds it open (a close will follow) — but
            // not a symlink or a hard link to an existing file (`ln -s`, `ln`),
            // which nobody writes and so never closes.
            (_, EventKind::Create(CreateKind::File | CreateKind::Any)) if created_open(path) => {
                paths.insert(path.to_owned());
            }
            // inotify: written to (a truncate is a modification too): a close
            // will follow; the close.
            (CloseSignal::CloseWrite, EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any)) => {
                paths.insert(path.to_owned());
            }
            (CloseSignal::CloseWrite, EventKind::Access(AccessKind::Close(AccessMode::Write))) => {
                paths.remove(path);
            }
            // FSEvents: the open's truncate; the content change of the close.
            (
                CloseSignal::ContentModified,
                EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
            ) if is_regular_file(path) => {
                paths.insert(path.to_owned());
            }
            (
                CloseSignal::ContentModified,
                EventKind::Modify(ModifyKind::Data(DataChange::Content)),
            ) => {
                paths.remove(path);
            }
            _ => {}
        }
    }

    /// Whether some file of the policy is being written in place.
    pub(crate) fn any(&self) -> bool {
        !self
            .paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Forgets every writer: after waiting for one too long (it may hold the file
    /// open for good), or after an event queue overflow lost its close.
    pub(crate) fn forget(&self) {
        self.paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Whether `path` is a regular file now (not a symlink: nobody writes those).
fn is_regular_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
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
        w.enable(CloseSignal::CloseWrite);
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
        w.enable(CloseSignal::CloseWrite);
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

    #[test]
    fn on_fsevents_a_truncate_or_create_is_open_until_the_content_change_of_the_close() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, "version = 1\n").unwrap();
        let w = OpenWrites::default();
        w.enable(CloseSignal::ContentModified);
        let truncated = EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any));
        let closed = EventKind::Modify(ModifyKind::Data(DataChange::Content));

        w.observe(&truncated, &p);
        assert!(
            w.any(),
            "O_TRUNC at open: FSE_STAT_CHANGED, the writer is not done"
        );
        w.observe(
            &EventKind::Modify(ModifyKind::Metadata(MetadataKind::Ownership)),
            &p,
        );
        assert!(w.any(), "a chown is not the close");
        w.observe(&closed, &p);
        assert!(!w.any(), "FSE_CONTENT_MODIFIED comes from vn_close");

        w.observe(&EventKind::Create(CreateKind::File), &p);
        assert!(w.any(), "O_CREAT: open in its creator");
        w.observe(&closed, &p);
        assert!(!w.any());

        w.observe(&truncated, &p);
        w.observe(&EventKind::Modify(ModifyKind::Name(RenameMode::Any)), &p);
        assert!(!w.any(), "renamed away");

        // inotify's events mean nothing here, and FSEvents' nothing to inotify.
        w.observe(&EventKind::Modify(ModifyKind::Data(DataChange::Any)), &p);
        assert!(!w.any());
        let linux = OpenWrites::default();
        linux.enable(CloseSignal::CloseWrite);
        linux.observe(&truncated, &p);
        assert!(!linux.any(), "IN_ATTRIB (chmod) on Linux is no writer");
    }
}
