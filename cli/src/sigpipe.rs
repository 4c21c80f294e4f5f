//! `SIGPIPE` back to its default action for the `metalift` CLI, so that
//! `metalift validate --json | head -1` ends the way `cat` does (quietly, killed
//! by the signal, 141 in a shell) instead of panicking in `println!` on `EPIPE`.
//! Rust's runtime ignores the signal at start-up; a filter-style CLI wants the
//! Unix default. (Not for metaliftd: a daemon must never die of a closed peer.)
//! A platform module: its one `signal(2)` call is its only unsafe operation.
#![allow(unsafe_code)]

/// Restores the default disposition of `SIGPIPE`.
pub fn restore_default() {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE; the CLI installs no
    // handler of its own for it, and nothing else runs yet (called first in main).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
