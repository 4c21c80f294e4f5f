//! Where the shim's words go: `syslog(3)` (the unified log on macOS, journald or
//! rsyslog on Linux), and stderr only when `METALIFT_DEBUG=1`.
//!
//! The shim does not call `openlog`: the ident and options it sets are
//! process-global, and a host that logs through syslog itself must keep its own.
//! Every message is prefixed `libmetalift: ` instead, after the host's ident.
//! Routine events (no daemon, a stock verdict for `ls`) are logged only in debug
//! mode; what an admin needs — the outcome at a Metal device's first init and any
//! failure — always is.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once by the constructor from `METALIFT_DEBUG=1`.
static DEBUG: AtomicBool = AtomicBool::new(false);

/// Turns stderr echo on or off.
pub(crate) fn set_debug(debug: bool) {
    DEBUG.store(debug, Ordering::Relaxed);
}

/// Whether `METALIFT_DEBUG=1` was given.
pub(crate) fn debug_enabled() -> bool {
    DEBUG.load(Ordering::Relaxed)
}

/// An outcome or notable event: always to syslog.
pub(crate) fn info(message: &str) {
    emit(libc::LOG_INFO, message);
}

/// Something went wrong (a hook could not be installed, a panic was caught).
pub(crate) fn warn(message: &str) {
    emit(libc::LOG_WARNING, message);
}

/// Routine detail: only with `METALIFT_DEBUG=1`.
pub(crate) fn debug(message: &str) {
    if debug_enabled() {
        emit(libc::LOG_DEBUG, message);
    }
}

fn emit(priority: libc::c_int, message: &str) {
    if debug_enabled() {
        eprintln!("libmetalift: {message}");
    }
    let text = format!("libmetalift: {message}").replace('\0', "\\0");
    let Ok(text) = CString::new(text) else {
        return;
    };
    // SAFETY: a constant "%s" format with one NUL-terminated string argument.
    unsafe { libc::syslog(priority | libc::LOG_USER, c"%s".as_ptr(), text.as_ptr()) };
}
