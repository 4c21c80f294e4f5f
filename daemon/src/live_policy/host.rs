//! The real machine behind the policy crate's [`Host`] lints (`metalift validate`),
//! and the one path resolution every tool shares.
//!
//! Rules match the resolved executable, because the kernel reports it resolved
//! (`/proc/<pid>/exe` on Linux; the audit token's path on macOS, from
//! `proc_pidpath`, which returns the vnode's path, symlinks resolved). So
//! `metalift explain --path` and `metalift audit --exe` resolve what the admin
//! types with [`resolve_executable`] before comparing it with rules or records.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use metalift_policy::{Host, PathFact};

/// `path` with every symlink resolved, as the kernel would report the executable;
/// `path` itself when it cannot be resolved (it does not exist: a "what if").
#[must_use]
pub fn resolve_executable(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// What the file system says about `path`.
#[must_use]
pub fn path_fact(path: &Path) -> PathFact {
    match fs::canonicalize(path) {
        Ok(resolved) if resolved == path => PathFact::Resolved,
        Ok(resolved) => PathFact::ResolvesTo {
            resolved,
            is_link: fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => PathFact::Missing,
        Err(e) => PathFact::Unknown(e.to_string()),
    }
}

/// The machine metalift runs on: its file system and its user database (NSS, the
/// same `getpwuid_r` lookup the daemon uses to fill a subject's user).
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

impl Host for RealHost {
    fn resolve(&self, path: &Path) -> PathFact {
        path_fact(path)
    }

    fn entries(&self, dir: &Path) -> Vec<PathBuf> {
        // A directory of thousands (a big bin/) is listed once per glob rule: bounded.
        fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .take(10_000)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn user_name(&self, uid: u32) -> Option<String> {
        crate::checkin::peer::user_name(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_resolves_to_its_target_and_a_missing_path_stays_as_typed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = fs::canonicalize(dir.path()).expect("canonical temp dir");
        let target = root.join("target");
        fs::write(&target, b"x").expect("write");
        let link = root.join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert_eq!(resolve_executable(&link), target);
        assert_eq!(path_fact(&target), PathFact::Resolved);
        assert_eq!(
            path_fact(&link),
            PathFact::ResolvesTo {
                resolved: target.clone(),
                is_link: true
            }
        );
        let missing = root.join("missing");
        assert_eq!(resolve_executable(&missing), missing);
        assert_eq!(path_fact(&missing), PathFact::Missing);
    }
}
