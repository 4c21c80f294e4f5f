//! Where an installation keeps its files, under a root (`/` normally; a temporary
//! directory in tests: `metalift doctor --root DIR`).

use std::path::{Path, PathBuf};

use crate::exec::{INSTALL_LIB_DIR, SHIM_FILE};

/// The installation's paths.
#[derive(Debug, Clone)]
pub struct Install {
    /// `/` or the `--root` directory.
    pub root: PathBuf,
    /// The main policy file.
    pub policy: PathBuf,
    /// The audit log.
    pub audit_log: PathBuf,
    /// The shim library.
    pub shim: PathBuf,
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Whether the socket was given (`--socket`), not guessed.
    pub socket_given: bool,
}

impl Install {
    /// `path` (absolute) under the root.
    #[must_use]
    pub fn under(root: &Path, path: &str) -> PathBuf {
        root.join(path.trim_start_matches('/'))
    }

    /// Directories whose launchd plists may name the shim: the system's agents and
    /// daemons, and every user's agents.
    #[must_use]
    pub fn launchd_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![
            Install::under(&self.root, "/Library/LaunchDaemons"),
            Install::under(&self.root, "/Library/LaunchAgents"),
        ];
        if let Ok(users) = std::fs::read_dir(Install::under(&self.root, "/Users")) {
            let mut homes: Vec<PathBuf> = users
                .filter_map(Result::ok)
                .map(|e| e.path().join("Library/LaunchAgents"))
                .filter(|d| d.is_dir())
                .collect();
            homes.sort();
            dirs.extend(homes);
        }
        dirs
    }

    /// The default place of the shim under `root`.
    #[must_use]
    pub fn default_shim(root: &Path) -> PathBuf {
        Install::under(root, INSTALL_LIB_DIR).join(SHIM_FILE)
    }
}

/// Whether `a` and `b` name the same file: the same device and inode when both
/// exist, else the same place once each existing directory on the way is resolved
/// (symbolic links, `..`, a relative path), so `./policy.toml`, a symlinked
/// `/etc` and the absolute path all agree, and a missing file compares by where it
/// would be.
#[must_use]
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return ma.dev() == mb.dev() && ma.ino() == mb.ino();
    }
    match (resolved(a), resolved(b)) {
        (Some(ra), Some(rb)) => ra == rb,
        _ => a == b,
    }
}

/// `path` with its existing directory resolved (`canonicalize`), its file name kept.
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(full) = path.canonicalize() {
        return Some(full);
    }
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(dir.canonicalize().ok()?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_or_symlinked_spelling_of_the_same_file_is_the_same_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("etc");
        std::fs::create_dir(&real).expect("etc");
        std::fs::write(real.join("policy.toml"), "version = 1\n").expect("policy");
        let link = dir.path().join("etc-link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        assert!(same_file(
            &real.join("policy.toml"),
            &link.join("policy.toml")
        ));
        assert!(same_file(
            &real.join("policy.toml"),
            &real.join("../etc/./policy.toml")
        ));
        // Missing files compare by where they would be.
        assert!(same_file(&real.join("gone.toml"), &link.join("gone.toml")));
        assert!(!same_file(
            &real.join("policy.toml"),
            &real.join("gone.toml")
        ));
    }
}
