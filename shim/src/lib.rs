//! libmetalift: injected into processes, checks in with metaliftd, and unlocks
//! Metal capabilities only when the verdict says so.
//!
//! # Layout
//!
//! - [`config`]: the environment (`METALIFT_SOCKET`, `METALIFT_TIMEOUT_MS`,
//!   `METALIFT_DISABLE`, `METALIFT_DEBUG`); nothing there can unlock.
//! - [`session`]: the one check-in per process and the only place a verdict
//!   becomes an unlock [`session::Plan`].
//! - [`transport`]: how the check-in travels (Unix socket; XPC plugs in beside it).
//! - [`objc`]: the Objective-C runtime, found with `dlsym` once Metal is there.
//! - [`hook`]: the device-init hook and the capability hooks, with roll-back.
//! - `linux` / `macos`: the constructor, and how the shim learns that Metal
//!   arrived later (an interposed `dlopen` / dyld's add-image callback).
//! - [`log`]: syslog, and stderr only with `METALIFT_DEBUG=1`.
//!
//! # Life of an injected process
//!
//! The constructor reads the environment, connects to the daemon without
//! blocking and sends the check-in, and hooks `_MTLDevice` if Metal is already
//! loaded (otherwise as soon as it is). A process that never creates a Metal
//! device pays that and nothing more. At the first device init the shim waits for
//! the verdict (at most the deadline), applies it or stays stock, and reports
//! the outcome on the same connection.
//!
//! Every entry point from C — the constructor, every hook IMP, the `dlopen`
//! interposer, the dyld callback — runs inside `ffi_boundary!`: a panic is
//! caught, logged, and turned into "stay stock" (or "call the original").
//! The crate keeps `panic = "unwind"` for that reason.

// In the unit-test build the platform entry points are left out (see below), so
// what only they call is unused there.
#![cfg_attr(test, allow(dead_code))]

/// Runs `$body`, and if it panics returns `$safe` instead: the single panic
/// boundary around everything C calls into. The safe value always means "behave
/// as if libmetalift were not there" (stay stock, or call the original IMP).
#[cfg_attr(test, allow(unused_macros))]
macro_rules! ffi_boundary {
    ($safe:expr, $body:expr) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| $body)) {
            Ok(value) => value,
            Err(_) => $safe,
        }
    };
}

pub(crate) mod config;
pub(crate) mod hook;
pub(crate) mod log;
pub(crate) mod objc;
pub(crate) mod session;
pub(crate) mod transport;

// The constructor and the exported `dlopen` are left out of the unit-test
// binary: a test harness should not check in with a daemon or interpose its own
// loader calls. The end-to-end tests inject the real cdylib instead.
#[cfg(all(target_os = "linux", not(test)))]
mod linux;
#[cfg(all(target_os = "macos", not(test)))]
mod macos;

use std::sync::atomic::{AtomicU8, Ordering};

/// The constructor has not finished: `dlopen`s made meanwhile (by other
/// libraries' constructors) are not examined; the constructor looks itself.
const LOADING: u8 = 0;
/// Checked in; watching for Metal.
const ACTIVE: u8 = 1;
/// `METALIFT_DISABLE=1`, or a panic in the constructor: do nothing at all.
const INERT: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(LOADING);

/// The constructor's work (inside the platform constructor's panic boundary).
/// Returns whether the shim is active.
pub(crate) fn on_load() -> bool {
    std::panic::set_hook(Box::new(|info| {
        // Our own copy of std: this hook sees only the shim's panics, never the host's.
        log::warn(&format!("internal error, staying stock: {info}"));
    }));
    let config = config::Config::from_env();
    log::set_debug(config.debug);
    for warning in &config.warnings {
        log::warn(warning);
    }
    if config.disabled {
        log::debug("METALIFT_DISABLE=1: no check-in, no hooks");
        STATE.store(INERT, Ordering::Release);
        return false;
    }
    session::begin(&config);
    STATE.store(ACTIVE, Ordering::Release);
    hook::metal_may_have_arrived(objc::Scope::Global);
    true
}

/// The constructor panicked: make sure nothing else runs.
pub(crate) fn on_load_failed() {
    STATE.store(INERT, Ordering::Release);
}

/// A library was loaded after start-up: look for Metal if still watching.
pub(crate) fn on_library_loaded(scope: objc::Scope) {
    if STATE.load(Ordering::Acquire) == ACTIVE && !hook::attempted() {
        hook::metal_may_have_arrived(scope);
    }
}
