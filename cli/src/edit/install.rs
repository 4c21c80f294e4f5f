//! Installing an edited policy atomically, with the owner and mode metaliftd
//! requires: written to a new file in the same directory, flushed, owned and
//! permissioned, checked, renamed over the old one — only if the old one is still
//! what the edit copied (see `replace`) — and the directory flushed. At every
//! instant the path names either the whole old file or the whole new one.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::replace;
use super::seen::{Change, Seen};

/// Who owns the installed file, and its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

/// Whether metaliftd accepts a file with this owner and mode without its
/// development override: owned by root, writable by nobody else.
#[must_use]
pub fn is_secure(uid: u32, mode: u32) -> bool {
    uid == 0 && mode & 0o022 == 0
}

/// The owner and mode for the new file: the old file's when it is secure;
/// otherwise root (uid 0, gid 0: `root:wheel` on macOS, `root:root` on Linux)
/// with 0644; a non-root editor gets its own ownership only with
/// `allow_insecure_owner` (development), and never group/other write.
pub fn placement(
    existing: Option<&fs::Metadata>,
    allow_insecure_owner: bool,
    euid: u32,
    egid: u32,
) -> anyhow::Result<Placement> {
    if let Some(meta) = existing {
        let mode = meta.mode() & 0o7777;
        if is_secure(meta.uid(), mode) {
            return Ok(Placement {
                uid: meta.uid(),
                gid: meta.gid(),
                mode,
            });
        }
    }
    if euid == 0 {
        return Ok(Placement {
            uid: 0,
            gid: 0,
            mode: 0o644,
        });
    }
    if allow_insecure_owner {
        let mode = existing.map_or(0o644, |m| m.mode() & 0o7777 & !0o022);
        return Ok(Placement {
            uid: euid,
            gid: egid,
            mode,
        });
    }
    bail!(
        "only root can install a policy metaliftd accepts (it must be owned by root and \
         writable by nobody else): run with sudo, or pass --allow-insecure-owner for a \
         development policy"
    )
}

/// Removes the new file unless the install completed.
struct NewFile(Option<PathBuf>);

impl Drop for NewFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Installs `contents` at `target` with `placement`, if `target` is still what
/// the edit `seen`; `Ok(Some(change))`: it changed, nothing was installed. Refuses
/// (leaving the old file untouched) if the result would not be secure, unless
/// `allow_insecure_owner`.
pub fn install(
    target: &Path,
    contents: &[u8],
    placement: Placement,
    allow_insecure_owner: bool,
    seen: &Seen,
) -> anyhow::Result<Option<Change>> {
    let dir = target.parent().unwrap_or_else(|| Path::new("."));
    let name = target
        .file_name()
        .map_or_else(|| "policy.toml".into(), |n| n.to_string_lossy());
    let new_path = dir.join(format!(".{name}.metalift-new.{}", std::process::id()));
    let _ = fs::remove_file(&new_path);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&new_path)
        .with_context(|| format!("cannot create {}", new_path.display()))?;
    let mut guard = NewFile(Some(new_path.clone()));
    let context = || format!("cannot write {}", new_path.display());
    file.write_all(contents).with_context(context)?;
    let meta = file.metadata().with_context(context)?;
    if (meta.uid(), meta.gid()) != (placement.uid, placement.gid) {
        std::os::unix::fs::fchown(&file, Some(placement.uid), Some(placement.gid)).with_context(
            || {
                format!(
                    "cannot give {} to uid {} gid {}",
                    new_path.display(),
                    placement.uid,
                    placement.gid
                )
            },
        )?;
    }
    file.set_permissions(fs::Permissions::from_mode(placement.mode))
        .with_context(context)?;
    file.sync_all().with_context(context)?;
    let meta = file.metadata().with_context(context)?;
    if !allow_insecure_owner && !is_secure(meta.uid(), meta.mode() & 0o7777) {
        bail!(
            "refusing to install {}: it would be owned by uid {} with mode {:04o}, which \
             metaliftd refuses",
            target.display(),
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
    drop(file);
    // From here `rename_if_unchanged` removes the new file whatever happens (or,
    // if the swap cannot be undone, says where the other writer's file is).
    guard.0 = None;
    if let Some(change) = replace::rename_if_unchanged(&new_path, target, seen)? {
        return Ok(Some(change));
    }
    // The rename is durable once the directory is.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot flush directory {}", dir.display()))?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_owned_files_nobody_else_can_write_are_secure() {
        assert!(is_secure(0, 0o644));
        assert!(is_secure(0, 0o600));
        assert!(!is_secure(0, 0o664));
        assert!(!is_secure(0, 0o646));
        assert!(!is_secure(501, 0o644));
    }

    #[test]
    fn a_secure_file_keeps_its_owner_and_mode_and_an_insecure_one_becomes_root_0644() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("p");
        fs::write(&f, "").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        let meta = fs::metadata(&f).unwrap();
        if meta.uid() == 0 {
            let p = placement(Some(&meta), false, 0, 0).unwrap();
            assert_eq!(p.mode, 0o640);
        }
        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        let meta = fs::metadata(&f).unwrap();
        assert_eq!(
            placement(Some(&meta), false, 0, 0).unwrap(),
            Placement {
                uid: 0,
                gid: 0,
                mode: 0o644
            }
        );
        // A non-root editor without the development override cannot install.
        assert!(placement(Some(&meta), false, 501, 20).is_err());
        assert_eq!(
            placement(Some(&meta), true, 501, 20).unwrap(),
            Placement {
                uid: 501,
                gid: 20,
                mode: 0o644
            }
        );
    }

    #[test]
    fn given_the_file_changed_since_it_was_copied_nothing_is_installed_and_no_new_file_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("policy.toml");
        fs::write(&target, "copied").unwrap();
        let (seen, _) = Seen::read(&target).unwrap();
        fs::write(&target, "theirs").unwrap();
        let meta = fs::metadata(&target).unwrap();
        let placement = Placement {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: 0o644,
        };
        let change = install(&target, b"mine", placement, true, &seen).unwrap();
        assert_eq!(change, Some(Change::Rewritten));
        assert_eq!(fs::read_to_string(&target).unwrap(), "theirs");
        let names: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["policy.toml"]);
        // Unchanged since it was copied: installed.
        let (seen, _) = Seen::read(&target).unwrap();
        assert_eq!(
            install(&target, b"mine", placement, true, &seen).unwrap(),
            None
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "mine");
    }
}
