//! Where metaliftd's Unix socket lives by default, so the daemon, the shim and the
//! CLI agree without configuration.
//!
//! | daemon | Linux | macOS |
//! |---|---|---|
//! | system-wide (root; the LaunchDaemon) | `/run/metalift/metalift.sock` | `/var/run/metalift/metalift.sock` |
//! | per user (the LaunchAgent, a user's own daemon) | `$XDG_RUNTIME_DIR/metalift.sock` | `/Users/Shared/metalift/metalift.sock` |
//!
//! macOS has no `/run`, and a LaunchAgent's user cannot create directories in
//! `/var/run`, so the agent's socket sits in a directory the installer creates in
//! `/Users/Shared`. A client (shim or CLI) takes the system socket when it exists,
//! else the per-user one. `METALIFT_SOCKET` / `--socket` override all of this.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The system-wide daemon's socket on this platform.
pub const SYSTEM_SOCKET: &str = if cfg!(target_os = "macos") {
    "/var/run/metalift/metalift.sock"
} else {
    "/run/metalift/metalift.sock"
};

/// The per-user LaunchAgent's socket on macOS.
pub const MACOS_AGENT_SOCKET: &str = "/Users/Shared/metalift/metalift.sock";

/// The socket's file name under `$XDG_RUNTIME_DIR` for a per-user daemon on Linux.
pub const USER_SOCKET_NAME: &str = "metalift.sock";

/// The per-user daemon's socket: the agent's fixed path on macOS, else
/// `runtime_dir/metalift.sock`; `None` when there is no runtime directory.
#[must_use]
pub fn user_socket(runtime_dir: Option<&OsStr>) -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        return Some(PathBuf::from(MACOS_AGENT_SOCKET));
    }
    runtime_dir
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(USER_SOCKET_NAME))
}

/// The socket a daemon listens on when none is given: the system socket as root,
/// else the per-user one (`None`: no place for it).
#[must_use]
pub fn daemon_socket(is_root: bool, runtime_dir: Option<&OsStr>) -> Option<PathBuf> {
    if is_root {
        return Some(PathBuf::from(SYSTEM_SOCKET));
    }
    user_socket(runtime_dir)
}

/// The socket a client tries when none is given: the system daemon's when
/// `system_exists`, else the per-user one, else the system path (so the error
/// names the usual place).
#[must_use]
pub fn client_socket(system_exists: bool, runtime_dir: Option<&OsStr>) -> PathBuf {
    if system_exists {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket(runtime_dir).unwrap_or_else(|| PathBuf::from(SYSTEM_SOCKET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_daemon_takes_the_system_socket_and_a_user_daemon_its_own() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(daemon_socket(true, run), Some(PathBuf::from(SYSTEM_SOCKET)));
        let user = daemon_socket(false, run).unwrap();
        if cfg!(target_os = "macos") {
            assert_eq!(user, PathBuf::from(MACOS_AGENT_SOCKET));
        } else {
            assert_eq!(user, PathBuf::from("/run/user/501/metalift.sock"));
            assert_eq!(daemon_socket(false, None), None);
            assert_eq!(daemon_socket(false, Some(OsStr::new(""))), None);
        }
    }

    #[test]
    fn a_client_prefers_the_system_socket_when_it_exists() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(client_socket(true, run), PathBuf::from(SYSTEM_SOCKET));
        assert_ne!(client_socket(false, run), PathBuf::from(SYSTEM_SOCKET));
        if !cfg!(target_os = "macos") {
            assert_eq!(client_socket(false, None), PathBuf::from(SYSTEM_SOCKET));
        }
    }
}
