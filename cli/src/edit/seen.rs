//! What `metalift edit` saw of the file it copied: whether it existed, whether it
//! was a symlink (and to what), and the SHA-256 of the bytes the copy was made
//! from. Compared again before anything is installed, so a change made by someone
//! else while the editor was open (a configuration tool replacing the policy, an
//! MDM script writing a drop-in) is never overwritten unseen.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The state of a path at one moment, as far as an edit cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// What the name itself is (`lstat`, not following a symlink).
    kind: Kind,
    /// SHA-256 of the contents read through the name; `None`: nothing to read
    /// (no file, or a symlink that leads nowhere).
    sha256: Option<[u8; 32]>,
}

/// What a name refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Absent,
    /// A regular file.
    File,
    /// A directory, socket, device…: never read (`metalift edit` refuses to start
    /// on one; one that appears during the edit is a change like any other).
    Other,
    /// A symlink, with the path it holds.
    Symlink(PathBuf),
}

/// How the file differs from what the edit copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It exists now and did not then.
    Created,
    /// It existed then and does not now.
    Deleted,
    /// It is a symlink now, or points elsewhere.
    Relinked,
    /// It was a symlink and is a plain file now.
    Unlinked,
    /// Same kind, other contents (replaced or written in place).
    Rewritten,
}

impl Change {
    /// "it was replaced or written", for "PATH changed during the edit (…)".
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Change::Created => "it was created",
            Change::Deleted => "it was deleted",
            Change::Relinked => "it became a symlink",
            Change::Unlinked => "it is no longer a symlink",
            Change::Rewritten => "it was replaced or written",
        }
    }
}

impl Seen {
    /// Nothing at the path.
    #[must_use]
    pub fn absent() -> Seen {
        Seen {
            kind: Kind::Absent,
            sha256: None,
        }
    }

    /// Looks at `path` now. Returns what it saw and the contents it hashed (empty
    /// when there was nothing to read), so a copy made from those bytes is exactly
    /// what the fingerprint describes.
    pub fn read(path: &Path) -> io::Result<(Seen, Vec<u8>)> {
        let kind = match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => Kind::Symlink(fs::read_link(path)?),
            Ok(meta) if meta.is_file() => Kind::File,
            Ok(_) => {
                return Ok((
                    Seen {
                        kind: Kind::Other,
                        sha256: None,
                    },
                    vec![],
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Seen::absent(), vec![])),
            Err(e) => return Err(e),
        };
        let (sha256, bytes) = match fs::read(path) {
            Ok(bytes) => (Some(Sha256::digest(&bytes).into()), bytes),
            // A symlink that leads nowhere, or a file removed since the lstat: the
            // next look sees the difference.
            Err(e) if e.kind() == io::ErrorKind::NotFound => (None, vec![]),
            Err(e) => return Err(e),
        };
        Ok((Seen { kind, sha256 }, bytes))
    }

    /// Whether the name exists (so a rename onto it replaces something).
    #[must_use]
    pub fn exists(&self) -> bool {
        self.kind != Kind::Absent
    }

    /// How `now` differs from `self`; `None`: it is what was seen.
    #[must_use]
    pub fn change_to(&self, now: &Seen) -> Option<Change> {
        match (&self.kind, &now.kind) {
            _ if self == now => None,
            (Kind::Absent, _) => Some(Change::Created),
            (_, Kind::Absent) => Some(Change::Deleted),
            (Kind::Symlink(_), Kind::File) => Some(Change::Unlinked),
            (_, Kind::Symlink(_)) if self.kind != now.kind => Some(Change::Relinked),
            _ => Some(Change::Rewritten),
        }
    }

    /// How the file at `path` now differs from `self`.
    pub fn check(&self, path: &Path) -> io::Result<Option<Change>> {
        Ok(self.change_to(&Seen::read(path)?.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_change_is_named_and_no_change_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("policy.toml");
        assert_eq!(Seen::read(&p).unwrap().0, Seen::absent());
        fs::write(&p, "a").unwrap();
        let (file, bytes) = Seen::read(&p).unwrap();
        assert_eq!(bytes, b"a");
        assert_eq!(Seen::absent().change_to(&file), Some(Change::Created));
        assert_eq!(file.check(&p).unwrap(), None);
        fs::write(&p, "b").unwrap();
        assert_eq!(file.check(&p).unwrap(), Some(Change::Rewritten));
        // Back to the same bytes: nothing an install would lose.
        fs::write(&p, "a").unwrap();
        assert_eq!(file.check(&p).unwrap(), None);
        fs::write(tmp.path().join("other"), "a").unwrap();
        fs::remove_file(&p).unwrap();
        assert_eq!(file.check(&p).unwrap(), Some(Change::Deleted));
        // A symlink to the same bytes is still a change: the install would replace it.
        std::os::unix::fs::symlink("other", &p).unwrap();
        assert_eq!(file.check(&p).unwrap(), Some(Change::Relinked));
        let (link, _) = Seen::read(&p).unwrap();
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("other"), &p).unwrap();
        assert_eq!(link.check(&p).unwrap(), Some(Change::Relinked));
        fs::remove_file(&p).unwrap();
        fs::write(&p, "a").unwrap();
        assert_eq!(link.check(&p).unwrap(), Some(Change::Unlinked));
        // A dangling symlink exists as a name.
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("nowhere", &p).unwrap();
        let (dangling, _) = Seen::read(&p).unwrap();
        assert!(dangling.exists());
        assert_eq!(dangling.check(&p).unwrap(), None);
        // A directory where the file was is a change, not an error.
        fs::remove_file(&p).unwrap();
        fs::create_dir(&p).unwrap();
        assert_eq!(file.check(&p).unwrap(), Some(Change::Rewritten));
    }
}
