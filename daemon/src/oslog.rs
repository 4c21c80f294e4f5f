//! A `tracing` layer that writes metaliftd's diagnostics into the system log: the
//! unified log on macOS, the journal (or syslogd) on Linux.
//!
//! # Why `syslog(3)` and not `os_log`
//!
//! `os_log_with_type` and friends are C macros: they build a compile-time format
//! buffer and call the private `_os_log_impl` with `__dso_handle`. Calling that from
//! Rust means either a C shim (`cc` at build time, which the `oslog` crate does) or
//! re-implementing the macro's private buffer encoding. `syslog(3)` is a plain libc
//! function (in the `libc` crate), and since macOS 10.12 libsystem routes it into the
//! unified log under the calling process, with the level mapped to an `os_log` type.
//! It costs us the subsystem/category fields, which we replace with the process name;
//! it gains one code path for macOS and Linux and nothing compiled from C. The text
//! arrives preformatted, so it is not subject to `os_log`'s `<private>` redaction
//! of dynamic arguments. The shim logs the same way (`shim/src/log.rs`).
//!
//! # Levels
//!
//! | tracing | syslog | unified log type (macOS; to confirm on a Mac) |
//! |---|---|---|
//! | ERROR | `LOG_ERR` | error |
//! | WARN | `LOG_WARNING` | default |
//! | INFO | `LOG_NOTICE` | default (persisted, shown without `--info`) |
//! | DEBUG | `LOG_INFO` | info |
//! | TRACE | `LOG_DEBUG` | debug |
//!
//! # For admins
//!
//! ```text
//! log show --predicate 'process == "metaliftd"' --last 1h          # macOS
//! log show --predicate 'process == "metaliftd"' --last 1h --info   # with DEBUG
//! log stream --predicate 'process == "metaliftd"'                  # live
//! journalctl -t metaliftd --since -1h                              # Linux
//! ```
//!
//! The audit trail is *not* here: decisions and outcomes go to the audit log
//! (JSON Lines). This layer carries the daemon's own diagnostics.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Longest line handed to `syslog(3)`; the unified log truncates near 1 KiB anyway.
const MAX_LINE: usize = 2048;

/// Sends every event to `syslog(3)` (the unified log on macOS).
#[derive(Debug)]
pub struct UnifiedLogLayer {
    /// The identity `openlog` keeps a pointer to: must outlive every `syslog` call.
    _ident: &'static CStr,
}

impl UnifiedLogLayer {
    /// Opens the system log as `ident` (e.g. `c"metaliftd"`), facility `LOG_DAEMON`,
    /// with the pid on every line.
    #[must_use]
    pub fn new(ident: &'static CStr) -> Self {
        // SAFETY: `ident` is 'static, as openlog(3) keeps the pointer.
        unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        UnifiedLogLayer { _ident: ident }
    }
}

impl<S: Subscriber> Layer<S> for UnifiedLogLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let line = format_event(event);
        let priority = syslog_priority(*event.metadata().level());
        // SAFETY: a constant "%s" format with exactly one NUL-terminated string
        // argument, so no text from the event is ever read as a format.
        unsafe { libc::syslog(priority, c"%s".as_ptr(), line.as_ptr()) };
    }
}

/// The syslog priority for a tracing level (see the module's table).
#[must_use]
pub fn syslog_priority(level: Level) -> libc::c_int {
    match level {
        Level::ERROR => libc::LOG_ERR,
        Level::WARN => libc::LOG_WARNING,
        Level::INFO => libc::LOG_NOTICE,
        Level::DEBUG => libc::LOG_INFO,
        Level::TRACE => libc::LOG_DEBUG,
    }
}

/// `target: message key=value …`, cut to [`MAX_LINE`] bytes, NUL bytes replaced.
fn format_event(event: &Event<'_>) -> CString {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let mut line = format!("{}: {}", event.metadata().target(), fields.message);
    line.push_str(&fields.rest);
    into_c_line(line)
}

/// Cuts at a character boundary and makes the text a valid C string.
fn into_c_line(mut line: String) -> CString {
    if line.len() > MAX_LINE {
        let mut end = MAX_LINE;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    let line = line.replace('\0', "\u{FFFD}");
    CString::new(line).unwrap_or_default()
}

/// Collects the `message` field apart from the others.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_so_that_info_is_persisted_and_debug_is_not() {
        assert_eq!(syslog_priority(Level::ERROR), libc::LOG_ERR);
        assert_eq!(syslog_priority(Level::INFO), libc::LOG_NOTICE);
        assert_eq!(syslog_priority(Level::DEBUG), libc::LOG_INFO);
    }

    /// Keeps the lines the unified-log layer would send.
    struct Capture(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Capture {
        fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
            let line = format_event(event).to_string_lossy().into_owned();
            self.0.lock().unwrap().push(line);
        }
    }

    #[test]
    fn an_event_becomes_target_message_then_fields() {
        use tracing_subscriber::layer::SubscriberExt;

        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let subscriber =
            tracing_subscriber::registry().with(Capture(std::sync::Arc::clone(&lines)));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "metaliftd::xpc", pid = 42, exe = "/bin/ls", "peer closed");
        });
        assert_eq!(
            *lines.lock().unwrap(),
            vec![r#"metaliftd::xpc: peer closed pid=42 exe="/bin/ls""#.to_owned()]
        );
    }

    #[test]
    fn a_line_with_a_nul_or_too_long_still_reaches_the_log() {
        let line = into_c_line(format!("a\0b{}", "é".repeat(MAX_LINE)));
        let bytes = line.as_bytes();
        assert!(
            bytes.len() <= MAX_LINE + 2,
            "cut (plus one replacement char)"
        );
        assert!(bytes.starts_with("a\u{FFFD}b".as_bytes()));
    }
}
