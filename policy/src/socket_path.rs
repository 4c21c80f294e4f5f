//! Where metaliftd's Unix socket lives by default, so the daemon, the shim and the
//! CLI agree without configuration (the C shim mirrors this file: keep them equal).
//!
//! | daemon | Linux | macOS |
//! |---|---|---|
//! | system-wide (root; the LaunchDaemon, the default install) | `/run/metalift/metalift.sock` | `/var/run/metalift/metalift.sock` |
//! | per user (opt-in LaunchAgent, a user's own daemon) | `$XDG_RUNTIME_DIR/metalift.sock` | `/Users/Shared/metalift/<uid>/metalift.sock` |
//!
//! # Resolution (clients: shim and CLI)
//!
//! `METALIFT_SOCKET` / `--socket`; else the system socket if it exists; else the
//! caller's per-user socket ([`client_socket_for`]).
//!
//! # Why a directory per uid on macOS
//!
//! macOS has no `/run`, and a LaunchAgent's user cannot create directories in
//! `/var/run`. An agent in `/Library/LaunchAgents` starts for *every* user who logs
//! in, so one shared socket directory made the second user's agent fail to bind
//! and launchd respawn it forever (issue 11 item 6). Each agent therefore creates
//! its own `/Users/Shared/metalift/<uid>/`, mode 0700, under a root-owned sticky
//! world-writable parent that the installer creates (like `/tmp`).
//!
//! Because anyone may create a directory in that parent, a squatter could create
//! another user's `<uid>` directory first. The agent refuses a directory it does
//! not own (one error line, a distinct exit code: see the agent launcher,
//! `pkg/libexec/metaliftd-agent`), and a client must connect only through a
//! directory [`agent_dir_is_trustworthy`] accepts: owned by the caller (or root),
//! writable by nobody else. Otherwise a fake daemon could hand out verdicts.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The system-wide daemon's socket on this platform.
pub const SYSTEM_SOCKET: &str = if cfg!(target_os = "macos") {
    "/var/run/metalift/metalift.sock"
} else {
    "/run/metalift/metalift.sock"
};

/// The parent of every per-user agent's socket directory on macOS (root-owned,
/// mode 1777, created by the installer).
pub const MACOS_AGENT_SOCKET_ROOT: &str = "/Users/Shared/metalift";

/// The socket's file name, in every directory above.
pub const USER_SOCKET_NAME: &str = "metalift.sock";

/// The mode an agent gives its own socket directory: only its user can reach it.
pub const AGENT_DIR_MODE: u32 = 0o700;

/// `/Users/Shared/metalift/<uid>`: the per-user agent's socket directory on macOS.
#[must_use]
pub fn macos_agent_dir(uid: u32) -> PathBuf {
    Path::new(MACOS_AGENT_SOCKET_ROOT).join(uid.to_string())
}

/// `/Users/Shared/metalift/<uid>/metalift.sock`: the per-user agent's socket on macOS.
#[must_use]
pub fn macos_agent_socket(uid: u32) -> PathBuf {
    macos_agent_dir(uid).join(USER_SOCKET_NAME)
}

/// The per-user daemon's socket for `uid`: [`macos_agent_socket`] on macOS, else
/// `runtime_dir/metalift.sock`; `None` when there is no runtime directory (Linux).
#[must_use]
pub fn user_socket_for(uid: u32, runtime_dir: Option<&OsStr>) -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        return Some(macos_agent_socket(uid));
    }
    runtime_dir
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(USER_SOCKET_NAME))
}

/// The socket a daemon running as `uid` listens on when none is given: the
/// system socket as root, else the per-user one (`None`: no place for it).
#[must_use]
pub fn daemon_socket_for(uid: u32, runtime_dir: Option<&OsStr>) -> Option<PathBuf> {
    if uid == 0 {
        return Some(PathBuf::from(SYSTEM_SOCKET));
    }
    user_socket_for(uid, runtime_dir)
}

/// The socket a client running as `uid` tries when none is given: the system
/// daemon's when `system_exists`, else its per-user one, else the system path
/// (so the error names the usual place).
#[must_use]
pub fn client_socket_for(system_exists: bool, uid: u32, runtime_dir: Option<&OsStr>) -> PathBuf {
    if system_exists || uid == 0 {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket_for(uid, runtime_dir).unwrap_or_else(|| PathBuf::from(SYSTEM_SOCKET))
}

/// Whether a client running as `caller_uid` may trust a per-user socket directory
/// owned by `dir_uid` with permission bits `dir_mode`: owned by the caller or by
/// root, and writable by no one else (group/other write bits clear). A directory
/// failing this may hold a socket planted by another user.
#[must_use]
pub fn agent_dir_is_trustworthy(dir_uid: u32, dir_mode: u32, caller_uid: u32) -> bool {
    (dir_uid == caller_uid || dir_uid == 0) && dir_mode & 0o022 == 0
}

/// The uid-less form of [`user_socket_for`], for callers that do not pass the uid
/// yet: on Linux the same answer; on macOS it cannot name the per-user socket
/// and returns `None`.
#[must_use]
pub fn user_socket(runtime_dir: Option<&OsStr>) -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        return None;
    }
    user_socket_for(u32::MAX, runtime_dir)
}

/// The uid-less form of [`daemon_socket_for`] (see [`user_socket`]).
#[must_use]
pub fn daemon_socket(is_root: bool, runtime_dir: Option<&OsStr>) -> Option<PathBuf> {
    if is_root {
        return Some(PathBuf::from(SYSTEM_SOCKET));
    }
    user_socket(runtime_dir)
}

/// The uid-less form of [`client_socket_for`] (see [`user_socket`]).
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
        assert_eq!(
            daemon_socket_for(0, run),
            Some(PathBuf::from(SYSTEM_SOCKET))
        );
        let user = daemon_socket_for(501, run).unwrap();
        if cfg!(target_os = "macos") {
            assert_eq!(
                user,
                PathBuf::from("/Users/Shared/metalift/501/metalift.sock")
            );
        } else {
            assert_eq!(user, PathBuf::from("/run/user/501/metalift.sock"));
            assert_eq!(daemon_socket_for(501, None), None);
            assert_eq!(daemon_socket_for(501, Some(OsStr::new(""))), None);
        }
    }

    #[test]
    fn two_users_agents_never_share_a_socket_directory_on_macos() {
        assert_eq!(
            macos_agent_socket(501),
            PathBuf::from("/Users/Shared/metalift/501/metalift.sock")
        );
        assert_ne!(macos_agent_dir(501), macos_agent_dir(502));
        assert_eq!(
            macos_agent_dir(502).parent(),
            Some(Path::new(MACOS_AGENT_SOCKET_ROOT))
        );
    }

    #[test]
    fn a_client_prefers_the_system_socket_when_it_exists() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(
            client_socket_for(true, 501, run),
            PathBuf::from(SYSTEM_SOCKET)
        );
        assert_ne!(
            client_socket_for(false, 501, run),
            PathBuf::from(SYSTEM_SOCKET)
        );
        assert_eq!(
            client_socket_for(false, 0, run),
            PathBuf::from(SYSTEM_SOCKET)
        );
        if !cfg!(target_os = "macos") {
            assert_eq!(
                client_socket_for(false, 501, None),
                PathBuf::from(SYSTEM_SOCKET)
            );
        }
    }

    #[test]
    fn a_directory_another_user_owns_or_may_write_is_not_trusted() {
        assert!(agent_dir_is_trustworthy(501, 0o700, 501));
        assert!(agent_dir_is_trustworthy(0, 0o755, 501));
        assert!(!agent_dir_is_trustworthy(502, 0o700, 501), "a squatter's");
        assert!(!agent_dir_is_trustworthy(501, 0o770, 501), "group-writable");
        assert!(
            !agent_dir_is_trustworthy(501, 0o1777, 501),
            "world-writable"
        );
    }

    #[test]
    fn the_uid_less_forms_agree_with_the_uid_forms_on_linux() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(daemon_socket(true, run), daemon_socket_for(0, run));
        if cfg!(target_os = "macos") {
            assert_eq!(user_socket(run), None);
        } else {
            assert_eq!(user_socket(run), user_socket_for(501, run));
            assert_eq!(
                client_socket(false, run),
                client_socket_for(false, 501, run)
            );
        }
    }
}
