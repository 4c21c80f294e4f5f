//! What the policy depends on in the file system: every directory entry the kernel
//! walks to reach `policy.toml` and `policy.d/` (each symlink, each link of a chain,
//! the final files), and the directories to watch so that a change to any of them
//! is seen.
//!
//! The walk is `realpath(3)` done by hand so that it can record every entry on the
//! way: `/etc/metalift/policy.toml -> ..data/policy.toml` with `..data -> ..2026_11_30`
//! (Kubernetes' ConfigMap layout) depends on `/etc/metalift/policy.toml`,
//! `/etc/metalift/..data`, `/etc/metalift/..2026_11_30` and
//! `/etc/metalift/..2026_11_30/policy.toml`, and an atomic swap of any of them
//! (a new link renamed over `..data`) must reload. Each entry's directory is
//! watched, so its creation, removal, rename and (for files) writes are events.
//! The directories of the way are watched too, so a directory on the way that is
//! deleted and created again is seen in its parent.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed before giving up (Linux's `MAXSYMLINKS` is 40).
const MAX_HOPS: usize = 40;

/// The entries a policy load reads through, and where to watch them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    /// Every path whose creation, removal, replacement or write can change what
    /// the policy loads: each entry walked, symlinks included, as absolute paths
    /// whose directories are resolved (the form inotify and FSEvents report).
    pub relevant: HashSet<PathBuf>,
    /// Resolved `policy.d/` directories: any `*.toml` entry in them is relevant.
    pub dropin_dirs: HashSet<PathBuf>,
    /// Directories to watch (existing ones; non-recursively).
    pub dirs: BTreeSet<PathBuf>,
    /// Whether `policy.toml` resolves to an existing file now.
    pub policy_exists: bool,
}

impl Chain {
    /// Walks `policy` and `policy.d/` beside it, as the loader will read them.
    pub(crate) fn resolve(policy: &Path) -> Chain {
        let mut chain = Chain::default();
        let policy = absolute(policy);
        chain.policy_exists = chain.walk(&policy).is_some_and(|p| p.is_file());
        let dropins = policy
            .parent()
            .map_or_else(|| PathBuf::from("/policy.d"), |d| d.join("policy.d"));
        if let Some(dir) = chain.walk(&dropins).filter(|d| d.is_dir()) {
            chain.dirs.insert(dir.clone());
            // A drop-in may itself be a link (config management): its chain counts too.
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    let path = entry.path();
                    let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
                    if is_link && is_dropin_name(&path) {
                        chain.walk(&path);
                    }
                }
            }
            chain.dropin_dirs.insert(dir);
        }
        chain
    }

    /// Whether a change at `path` (as the watcher reports it) can change what loads.
    pub(crate) fn concerns(&self, path: &Path) -> bool {
        self.relevant.contains(path)
            || (path
                .parent()
                .is_some_and(|dir| self.dropin_dirs.contains(dir))
                && is_dropin_name(path))
    }

    /// Whether any entry of the chain, a watched directory or a drop-in changed
    /// (its ctime, which every write, rename, link and chmod sets) at or after
    /// `since`. Unreadable entries count as changed.
    pub(crate) fn changed_since(&self, since: std::time::SystemTime) -> bool {
        use std::os::unix::fs::MetadataExt;
        let changed = |path: &Path| match std::fs::symlink_metadata(path) {
            Ok(m) => {
                let ctime = u64::try_from(m.ctime()).ok().map(|secs| {
                    std::time::UNIX_EPOCH
                        + std::time::Duration::new(secs, u32::try_from(m.ctime_nsec()).unwrap_or(0))
                });
                ctime.is_none_or(|t| t >= since)
            }
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        };
        let dropins = self
            .dropin_dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .flatten()
            .map(|e| e.path());
        self.relevant.iter().any(|p| changed(p))
            || self.dirs.iter().any(|p| changed(p))
            || dropins.into_iter().any(|p| changed(&p))
    }

    /// Resolves `path` entry by entry, recording each entry and its directory.
    /// Returns the final resolved path, or `None` when an entry is missing (the
    /// deepest existing directory is then watched for its creation) or the links
    /// loop.
    fn walk(&mut self, path: &Path) -> Option<PathBuf> {
        let mut pending: VecDeque<Step> = steps(path).collect();
        let mut cur = PathBuf::from("/");
        let mut hops = 0;
        while let Some(step) = pending.pop_front() {
            let name = match step {
                Step::Root => {
                    cur = PathBuf::from("/");
                    continue;
                }
                Step::Up => {
                    cur.pop();
                    continue;
                }
                Step::Name(name) => name,
            };
            let next = cur.join(&name);
            self.relevant.insert(next.clone());
            if worth_watching(&cur) {
                self.dirs.insert(cur.clone());
            }
            let meta = std::fs::symlink_metadata(&next).ok()?;
            if meta.file_type().is_symlink() {
                hops += 1;
                if hops > MAX_HOPS {
                    return None;
                }
                let target = std::fs::read_link(&next).ok()?;
                // The link's target replaces it; relative targets start at `cur`.
                for step in steps(&target).collect::<Vec<_>>().into_iter().rev() {
                    pending.push_front(step);
                }
            } else {
                cur = next;
            }
        }
        Some(cur)
    }
}

/// Whether the loader reads a `policy.d/` entry of this name (`*.toml`, not hidden).
pub(crate) fn is_dropin_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".toml") && !n.starts_with('.'))
}

/// The root is never watched: its entries do not change in practice, and on macOS
/// an FSEvents stream there would carry every event of the disk. On macOS the
/// first-level directories (`/private`, which holds `/private/var`) are skipped for
/// the same reason; the periodic re-check still covers them.
fn worth_watching(dir: &Path) -> bool {
    let depth = dir.components().count();
    if cfg!(target_os = "macos") {
        depth > 2
    } else {
        depth > 1
    }
}

#[derive(Debug, Clone)]
enum Step {
    Root,
    Up,
    Name(OsString),
}

fn steps(path: &Path) -> impl Iterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::RootDir | Component::Prefix(_) => Some(Step::Root),
        Component::CurDir => None,
        Component::ParentDir => Some(Step::Up),
        Component::Normal(n) => Some(Step::Name(n.to_owned())),
    })
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_kubernetes_style_chain_makes_every_link_and_the_target_relevant() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let etc = root.join("etc");
        let v1 = etc.join("..2026_11_30");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("policy.toml"), "version = 1\n").unwrap();
        symlink("..2026_11_30", etc.join("..data")).unwrap();
        symlink("..data/policy.toml", etc.join("policy.toml")).unwrap();

        let chain = Chain::resolve(&etc.join("policy.toml"));
        assert!(chain.policy_exists);
        for p in [
            etc.join("policy.toml"),
            etc.join("..data"),
            etc.join("..2026_11_30"),
            v1.join("policy.toml"),
            etc.join("policy.d"),
        ] {
            assert!(chain.concerns(&p), "{} not relevant", p.display());
        }
        assert!(chain.dirs.contains(&etc));
        assert!(chain.dirs.contains(&v1));
        assert!(
            chain.dirs.contains(&root),
            "the way's directories are watched"
        );
        assert!(!chain.concerns(&etc.join("audit.jsonl")));
        assert!(!chain.concerns(&etc.join(".policy.toml.swp")));
    }

    #[test]
    fn drop_ins_are_relevant_by_name_and_a_missing_policy_is_noticed() {
        let tmp = tempfile::tempdir().unwrap();
        let etc = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir(etc.join("policy.d")).unwrap();
        let chain = Chain::resolve(&etc.join("policy.toml"));
        assert!(!chain.policy_exists);
        assert!(chain.concerns(&etc.join("policy.d/10-fleet.toml")));
        assert!(!chain.concerns(&etc.join("policy.d/.10-fleet.toml.swp")));
        assert!(!chain.concerns(&etc.join("policy.d/10-fleet.toml~")));
        assert!(chain.dirs.contains(&etc.join("policy.d")));
    }

    #[test]
    fn a_change_is_seen_by_its_ctime_and_nothing_changed_after_now() {
        let tmp = tempfile::tempdir().unwrap();
        let etc = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::write(etc.join("policy.toml"), "version = 1\n").unwrap();
        std::fs::create_dir(etc.join("policy.d")).unwrap();
        let chain = Chain::resolve(&etc.join("policy.toml"));
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        assert!(!chain.changed_since(later));
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        assert!(chain.changed_since(before));
    }

    #[test]
    fn a_symlink_loop_ends_the_walk() {
        let tmp = tempfile::tempdir().unwrap();
        let etc = std::fs::canonicalize(tmp.path()).unwrap();
        symlink("b", etc.join("a")).unwrap();
        symlink("a", etc.join("b")).unwrap();
        symlink("a", etc.join("policy.toml")).unwrap();
        let chain = Chain::resolve(&etc.join("policy.toml"));
        assert!(!chain.policy_exists);
        assert!(chain.concerns(&etc.join("a")));
    }
}
