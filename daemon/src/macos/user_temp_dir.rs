//! The user's own temporary directory, `confstr(_CS_DARWIN_USER_TEMP_DIR)`: where
//! a per-user metaliftd (the opt-in LaunchAgent) puts its socket
//! (`metalift_policy::socket_path`).
//!
//! Libc's `confstr` (`gen/confstr.c`) answers `_CS_DARWIN_USER_TEMP_DIR` with
//! `_dirhelper(DIRHELPER_USER_LOCAL_TEMP, …)` (Apple's `dirhelper.c`):
//! `/var/folders/<bucket>/<uuid+uid>/T/`, the parent made by the root dirhelper
//! service and `T/` made 0700 by the calling user's process if missing. The
//! answer ends in `/`.

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::OsStringExt;

/// `confstr(_CS_DARWIN_USER_TEMP_DIR)` for the effective user, or `None` when
/// libSystem cannot name it (e.g. no directory service answer for the uid).
#[must_use]
pub fn darwin_user_temp_dir() -> Option<OsString> {
    // PATH_MAX (1024) holds any path confstr can return; it says how much it needed.
    let mut buf = [0 as libc::c_char; 1024];
    // SAFETY: buf is valid for buf.len() bytes; confstr writes at most that many,
    // NUL-terminated, and returns the size it needed (0 on error).
    let needed =
        unsafe { libc::confstr(libc::_CS_DARWIN_USER_TEMP_DIR, buf.as_mut_ptr(), buf.len()) };
    if needed == 0 || needed > buf.len() {
        return None;
    }
    // SAFETY: confstr succeeded with a length that fit, so buf holds a NUL-terminated string.
    let dir = unsafe { CStr::from_ptr(buf.as_ptr()) };
    let bytes = dir.to_bytes();
    (!bytes.is_empty()).then(|| OsString::from_vec(bytes.to_vec()))
}
