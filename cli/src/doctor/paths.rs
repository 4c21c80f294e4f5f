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
