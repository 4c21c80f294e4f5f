//! The panic boundary around every callback libxpc or libdispatch invokes in the
//! daemon (issue 11 item 5): a panic must never unwind into C.
//!
//! block2's invoke functions are `extern "C-unwind"`, so a panic inside an XPC
//! event handler would unwind through libdispatch's frames: undefined behaviour
//! in practice (libdispatch is not unwind-safe; at best the process aborts with
//! the dispatch queue's lock held). Every closure handed to libxpc/libdispatch
//! therefore runs inside [`callback`], which catches the panic, logs it as an
//! error naming the callback, and returns a chosen safe value instead.
//!
//! Plain Rust: unit-tested on every platform (`service/oslog.rs` includes this file in
//! its tests so Linux runs them), used on macOS by `checkin/transport/xpc/mod.rs`.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; if it panics, logs the panic (error level) as coming from the
/// callback `what` and returns `fallback`.
///
/// `AssertUnwindSafe`: what the XPC handlers capture is a channel sender, a
/// semaphore and flags, which a panic leaves consistent (no invariant spans the
/// panic point); the handler simply does nothing for that one event.
pub fn callback<T>(what: &'static str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(payload) => {
            tracing::error!(
                callback = what,
                panic = panic_message(payload.as_ref()),
                "a panic was stopped at the boundary to libxpc/libdispatch; this event is dropped"
            );
            fallback
        }
    }
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
#[must_use]
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(a panic without a message)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_that_returns_gives_its_value() {
        assert_eq!(callback("test", 0, || 7), 7);
    }

    #[test]
    fn a_panicking_callback_gives_the_fallback_instead_of_unwinding() {
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let value = callback("test", 42, || -> i32 { panic!("boom {}", 1) });
        let text = callback("test", "fallback", || panic!("static text"));
        std::panic::set_hook(quiet);
        assert_eq!(value, 42);
        assert_eq!(text, "fallback");
    }

    #[test]
    fn the_panic_message_is_read_from_both_payload_kinds() {
        let s: Box<dyn Any + Send> = Box::new("static");
        let owned: Box<dyn Any + Send> = Box::new(String::from("owned"));
        let other: Box<dyn Any + Send> = Box::new(5_u8);
        assert_eq!(panic_message(s.as_ref()), "static");
        assert_eq!(panic_message(owned.as_ref()), "owned");
        assert_eq!(panic_message(other.as_ref()), "(a panic without a message)");
    }
}
