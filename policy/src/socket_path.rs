//! Where metaliftd's Unix socket lives by default, so the daemon, the shim and the
//! CLI agree without configuration (the C shim mirrors this file: keep them equal).
//!
//! | daemon | Linux | macOS |
//! |---|---|---|
//! | system-wide (root; the LaunchDaemon, the default install) | `/run/metalift/metalift.sock` | `/var/run/metalift/metalift.sock` |
//! | per user (opt-in LaunchAgent, a user's own daemon) | `$XDG_RUNTIME_DIR/metalift.sock` | `<DARWIN_USER_TEMP_DIR>metalift.sock` |
//!
//! One rule for both platforms: the per-user socket is `metalift.sock` in the
//! user's *private directory* ([`user_socket`]), a directory the system makes for
//! that user alone. Which directory that is, is the platform's part, found by the
//! caller and passed in (so the rule stays pure and testable anywhere):
//!
//! - Linux: `$XDG_RUNTIME_DIR` (systemd-logind's `/run/user/<uid>`, 0700).
//! - macOS: `confstr(_CS_DARWIN_USER_TEMP_DIR)`, e.g.
//!   `/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/` (with its trailing
//!   slash; `getconf DARWIN_USER_TEMP_DIR` prints the same). Libc's `confstr`
//!   calls `_dirhelper(DIRHELPER_USER_LOCAL_TEMP)` (Apple's `dirhelper.c`):
//!   `/var/folders/<bucket>/<uuid+uid>/` is created by the root `dirhelper`
//!   service (or by root itself) under root-owned 0755 directories, and `T/` in
//!   it with mode 0700 by the user's own process. No other user can create or
//!   enter either, so nobody can squat the socket's directory (as anyone could
//!   with the `/Users/Shared/metalift/<uid>/` of earlier releases).
//!   Two cases get another directory from the same call and so do not find the
//!   agent (they stay stock, as without a daemon): an App-Sandboxed process
//!   (its container's `T/`), and one with `DIRHELPER_USER_DIR_SUFFIX` set.
//!
//! # Resolution (clients: shim and CLI)
//!
//! `METALIFT_SOCKET` / `--socket`; else the system socket if it exists; else the
//! caller's per-user socket ([`client_socket`]). A client connects through a
//! per-user directory only if [`agent_dir_is_trustworthy`] accepts it: owned by
//! the caller (or root), writable by nobody else.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The system-wide daemon's socket on this platform.
pub const SYSTEM_SOCKET: &str = if cfg!(target_os = "macos") {
    "/var/run/metalift/metalift.sock"
} else {
    "/run/metalift/metalift.sock"
};

/// The socket's file name, in every directory above.
pub const USER_SOCKET_NAME: &str = "metalift.sock";

/// What names the user's private directory on this platform, for messages.
pub const PRIVATE_DIR: &str = if cfg!(target_os = "macos") {
    "confstr(_CS_DARWIN_USER_TEMP_DIR)"
} else {
    "$XDG_RUNTIME_DIR"
};

/// The per-user daemon's socket: `metalift.sock` in `private_dir`, the user's
/// private directory (`$XDG_RUNTIME_DIR` on Linux, `DARWIN_USER_TEMP_DIR` on
/// macOS; see the module doc). `None` when there is none (absent or empty).
#[must_use]
pub fn user_socket(private_dir: Option<&OsStr>) -> Option<PathBuf> {
    private_dir
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(USER_SOCKET_NAME))
}

/// The socket a daemon listens on when none is given: the system socket as
/// root, else the per-user one in `private_dir` (`None`: no place for it).
#[must_use]
pub fn daemon_socket(is_root: bool, private_dir: Option<&OsStr>) -> Option<PathBuf> {
    if is_root {
        return Some(PathBuf::from(SYSTEM_SOCKET));
    }
    user_socket(private_dir)
}

/// The socket a client tries when none is given: the system daemon's when
/// `system_exists`, else its per-user one, else the system path (so the error
/// names the usual place).
#[must_use]
pub fn client_socket(system_exists: bool, private_dir: Option<&OsStr>) -> PathBuf {
    if system_exists {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket(private_dir).unwrap_or_else(|| PathBuf::from(SYSTEM_SOCKET))
}

/// [`daemon_socket`] for a daemon running as `uid` (root: the system socket).
#[must_use]
pub fn daemon_socket_for(uid: u32, private_dir: Option<&OsStr>) -> Option<PathBuf> {
    daemon_socket(uid == 0, private_dir)
}

/// [`client_socket`] for a client running as `uid`: root always talks to the
/// system daemon.
#[must_use]
pub fn client_socket_for(system_exists: bool, uid: u32, private_dir: Option<&OsStr>) -> PathBuf {
    client_socket(system_exists || uid == 0, private_dir)
}

/// Whether a client running as `caller_uid` may trust a per-user socket directory
/// owned by `dir_uid` with permission bits `dir_mode`: owned by the caller or by
/// root, and writable by no one else (group/other write bits clear). A directory
/// failing this may hold a socket planted by another user.
#[must_use]
pub fn agent_dir_is_trustworthy(dir_uid: u32, dir_mode: u32, caller_uid: u32) -> bool {
    (dir_uid == caller_uid || dir_uid == 0) && dir_mode & 0o022 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `confstr(_CS_DARWIN_USER_TEMP_DIR)` returns: note the trailing slash.
    const DARWIN_TEMP: &str = "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/";

    #[test]
    fn a_root_daemon_takes_the_system_socket_and_a_user_daemon_its_private_dir() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(
            daemon_socket_for(0, run),
            Some(PathBuf::from(SYSTEM_SOCKET))
        );
        assert_eq!(
            daemon_socket_for(501, run),
            Some(PathBuf::from("/run/user/501/metalift.sock"))
        );
        assert_eq!(daemon_socket_for(501, None), None);
        assert_eq!(daemon_socket_for(501, Some(OsStr::new(""))), None);
    }

    #[test]
    fn on_macos_the_agent_socket_is_in_the_users_darwin_temp_dir() {
        let socket = daemon_socket_for(501, Some(OsStr::new(DARWIN_TEMP))).unwrap();
        assert_eq!(
            socket,
            PathBuf::from("/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/metalift.sock")
        );
        // Right under the user's own 0700 directory: no directory of ours that a
        // squatter could create first, and nothing under /Users/Shared.
        assert_eq!(
            socket.parent(),
            Some(Path::new(DARWIN_TEMP.trim_end_matches('/')))
        );
        assert!(!socket.starts_with("/Users/Shared"));
        // sun_path holds 104 bytes on macOS (with the NUL).
        assert!(socket.as_os_str().len() < 104);
        // Two users, two private directories, two sockets.
        let other = daemon_socket_for(
            502,
            Some(OsStr::new(
                "/var/folders/q1/q1xv8xvq6csfxvn_n0000000000000/T/",
            )),
        );
        assert_ne!(Some(socket), other);
    }

    #[test]
    fn a_client_prefers_the_system_socket_when_it_exists() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(
            client_socket_for(true, 501, run),
            PathBuf::from(SYSTEM_SOCKET)
        );
        assert_eq!(
            client_socket_for(false, 501, run),
            PathBuf::from("/run/user/501/metalift.sock")
        );
        assert_eq!(
            client_socket_for(false, 0, run),
            PathBuf::from(SYSTEM_SOCKET)
        );
        assert_eq!(
            client_socket_for(false, 501, None),
            PathBuf::from(SYSTEM_SOCKET)
        );
        assert_eq!(
            client_socket(false, Some(OsStr::new(DARWIN_TEMP))),
            Path::new(DARWIN_TEMP).join(USER_SOCKET_NAME)
        );
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
    fn the_uid_forms_agree_with_the_plain_ones() {
        let run = Some(OsStr::new("/run/user/501"));
        assert_eq!(daemon_socket(true, run), daemon_socket_for(0, run));
        assert_eq!(daemon_socket(false, run), daemon_socket_for(501, run));
        assert_eq!(user_socket(run), daemon_socket_for(501, run));
        assert_eq!(
            client_socket(false, run),
            client_socket_for(false, 501, run)
        );
    }
}
