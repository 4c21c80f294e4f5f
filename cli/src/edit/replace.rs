//! The last step of an install: putting the new file in place only if the old
//! one is still what the edit copied ([`Seen`]), so a change someone else made
//! during the edit is never overwritten unseen.
//!
//! POSIX has no conditional rename, so the check and the rename are two steps.
//! The window between them is kept as small as this module can make it:
//!
//! - The file is looked at again right before the rename, after the new file is
//!   written, flushed, owned and permissioned (nothing slow is left after the look).
//! - The file did not exist: `renameat2(RENAME_NOREPLACE)` on Linux,
//!   `renameatx_np(RENAME_EXCL)` on macOS (both through rustix's `renameat_with`),
//!   fail with `EEXIST` if a file appeared, so here there is no window at all. On
//!   a file system without them, `link(2)` gives the same guarantee (it never
//!   replaces a name).
//! - The file existed: the new file is *swapped* with it (`RENAME_EXCHANGE` on
//!   Linux, `RENAME_SWAP` on macOS), then the file swapped out is compared with
//!   what was seen. A change that landed before the swap — replaced, rewritten,
//!   deleted or relinked, however late — is caught exactly, and the swap is undone,
//!   so their file is back at the path. What remains: (a) between the two swaps
//!   (microseconds) the path shows the new, validated file, which a watching
//!   metaliftd may load before the swap back makes it load theirs; (b) a writer
//!   that opened the old file before the swap and writes into it after the
//!   comparison writes into a file that is no longer installed (as with any atomic
//!   save); (c) a file renamed onto the path after the swap replaces the new one
//!   (their change wins; the edit reports it installed). On a file system without
//!   the swap (`EINVAL`/`ENOTSUP`), a plain `rename(2)` follows the last look, and
//!   a change landing between the two is lost: that window is a few system calls.
//!
//! Apple: xnu `bsd/vfs/vfs_syscalls.c` `renameat_internal` returns `EEXIST` for
//! `VFS_RENAME_EXCL` when the target exists and `ENOENT` for `VFS_RENAME_SWAP`
//! when it does not; `bsd/vfs/kpi_vfs.c` `vn_rename` passes the flags to
//! `VNOP_RENAMEX`, which a file system without them answers with `ENOTSUP`.

use std::fs;
use std::io;
use std::path::Path;

use anyhow::Context as _;
use rustix::fs::{renameat_with, RenameFlags, CWD};
use rustix::io::Errno;

use super::seen::{Change, Seen};

/// Moves `new` to `target` (the same directory) if `target` is still `seen`.
/// `Ok(None)`: installed, and `new` is gone. `Ok(Some(change))`: not installed,
/// `target` is as the other writer left it, and `new` is removed.
pub fn rename_if_unchanged(
    new: &Path,
    target: &Path,
    seen: &Seen,
) -> anyhow::Result<Option<Change>> {
    let look = || {
        seen.check(target)
            .with_context(|| format!("cannot read {} to see if it changed", target.display()))
    };
    if let Some(change) = look()? {
        remove(new);
        return Ok(Some(change));
    }
    if seen.exists() {
        swap_if_unchanged(new, target, seen)
    } else {
        create_if_absent(new, target)
    }
}

/// The target did not exist: create it without ever replacing a name.
fn create_if_absent(new: &Path, target: &Path) -> anyhow::Result<Option<Change>> {
    let placed = match renameat_with(CWD, new, CWD, target, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) if unsupported(e) => link_if_absent(new, target),
        Err(e) => Err(e.into()),
    };
    match placed {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            remove(new);
            Ok(Some(Change::Created))
        }
        Err(e) => {
            remove(new);
            Err(e)
                .with_context(|| format!("cannot rename {} to {}", new.display(), target.display()))
        }
    }
}

/// `link(2)` never replaces a name (`EEXIST`): the portable "create if absent".
fn link_if_absent(new: &Path, target: &Path) -> io::Result<()> {
    fs::hard_link(new, target)?;
    remove(new);
    Ok(())
}

/// The target existed: swap, compare what was swapped out, and swap back if it
/// is not what was seen.
fn swap_if_unchanged(new: &Path, target: &Path, seen: &Seen) -> anyhow::Result<Option<Change>> {
    let rename_context = || format!("cannot rename {} over {}", new.display(), target.display());
    match renameat_with(CWD, new, CWD, target, RenameFlags::EXCHANGE) {
        Ok(()) => {}
        // Deleted since the last look: the swap needs two names.
        Err(Errno::NOENT) => {
            remove(new);
            return Ok(Some(Change::Deleted));
        }
        Err(e) if unsupported(e) => {
            // The window named in the module doc: a few system calls long.
            return match fs::rename(new, target) {
                Ok(()) => Ok(None),
                Err(e) => {
                    remove(new);
                    Err(e).with_context(rename_context)
                }
            };
        }
        Err(e) => {
            remove(new);
            return Err(io::Error::from(e)).with_context(rename_context);
        }
    }
    // `new` now names what was at `target` at the instant of the swap.
    let swapped_out = seen.check(new);
    match swapped_out {
        Ok(None) => {
            remove(new);
            Ok(None)
        }
        Ok(Some(change)) => {
            swap_back(new, target)?;
            Ok(Some(change))
        }
        Err(e) => {
            swap_back(new, target)?;
            Err(e).with_context(|| {
                format!(
                    "cannot read the replaced {} to see if it changed",
                    target.display()
                )
            })
        }
    }
}

/// Undoes the swap, leaving the other writer's file at `target`; on failure,
/// says where their file is (it is not removed).
fn swap_back(new: &Path, target: &Path) -> anyhow::Result<()> {
    renameat_with(CWD, new, CWD, target, RenameFlags::EXCHANGE).with_context(|| {
        format!(
            "{} changed during the install and cannot be put back: the new policy is \
             installed and the changed file is {}",
            target.display(),
            new.display()
        )
    })?;
    remove(new);
    Ok(())
}

/// The flags are not supported by this kernel or file system.
fn unsupported(e: Errno) -> bool {
    [Errno::INVAL, Errno::NOSYS, Errno::NOTSUP, Errno::OPNOTSUPP].contains(&e)
}

fn remove(path: &Path) {
    let _ = fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(target: Option<&str>) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let target_path = tmp.path().join("policy.toml");
        if let Some(text) = target {
            fs::write(&target_path, text).unwrap();
        }
        let new = tmp.path().join(".policy.toml.new");
        fs::write(&new, "mine").unwrap();
        (tmp, new, target_path)
    }

    #[test]
    fn an_unchanged_file_is_replaced_and_the_new_name_is_gone() {
        let (_tmp, new, target) = setup(Some("old"));
        let (seen, _) = Seen::read(&target).unwrap();
        assert_eq!(rename_if_unchanged(&new, &target, &seen).unwrap(), None);
        assert_eq!(fs::read_to_string(&target).unwrap(), "mine");
        assert!(!new.exists());
    }

    #[test]
    fn a_file_that_did_not_exist_is_created() {
        let (_tmp, new, target) = setup(None);
        assert_eq!(
            rename_if_unchanged(&new, &target, &Seen::absent()).unwrap(),
            None
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "mine");
        assert!(!new.exists());
    }

    /// The change lands after the last look (simulated by skipping it): the swap
    /// sees it and puts their file back.
    #[test]
    fn given_a_change_after_the_last_look_the_swap_is_undone() {
        let (_tmp, new, target) = setup(Some("old"));
        let (seen, _) = Seen::read(&target).unwrap();
        fs::write(&target, "theirs").unwrap();
        assert_eq!(
            swap_if_unchanged(&new, &target, &seen).unwrap(),
            Some(Change::Rewritten)
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "theirs");
        assert!(!new.exists());
    }

    #[test]
    fn given_a_file_created_after_the_last_look_it_is_not_replaced() {
        let (_tmp, new, target) = setup(None);
        fs::write(&target, "theirs").unwrap();
        assert_eq!(
            create_if_absent(&new, &target).unwrap(),
            Some(Change::Created)
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "theirs");
        assert!(!new.exists());
    }

    /// The fallback where the kernel or file system lacks `RENAME_NOREPLACE`.
    #[test]
    fn without_noreplace_a_link_creates_the_file_and_never_replaces_one() {
        let (_tmp, new, target) = setup(None);
        link_if_absent(&new, &target).unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "mine");
        assert!(!new.exists());
        fs::write(&new, "again").unwrap();
        let e = link_if_absent(&new, &target).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read_to_string(&target).unwrap(), "mine");
    }

    #[test]
    fn given_a_file_deleted_after_the_last_look_it_stays_deleted() {
        let (_tmp, new, target) = setup(Some("old"));
        let (seen, _) = Seen::read(&target).unwrap();
        fs::remove_file(&target).unwrap();
        assert_eq!(
            swap_if_unchanged(&new, &target, &seen).unwrap(),
            Some(Change::Deleted)
        );
        assert!(!target.exists());
        assert!(!new.exists());
    }
}
