//! A `tracing` layer that writes metaliftd's diagnostics into the system log: the
//! unified log on macOS (`os_log`, subsystem `com.metalift`, category `daemon`),
//! the journal (or syslogd) through `syslog(3)` on Linux.
//!
//! # Why a C file on macOS
//!
//! `syslog(pri, "%s", text)` on macOS becomes an `os_log` call whose dynamic
//! argument is redacted to `<private>` in `log show`, `LOG_ERR` lands at the
//! default level and `LOG_INFO` is not persisted (issue 11 item 4). `os_log` is a
//! macro: clang's `__builtin_os_log_format` builds the argument buffer and the
//! format string must live in the image's `__TEXT,__oslogstring` section. So
//! `daemon/c/oslog.c` (built by `daemon/build.rs` for macOS targets) holds one
//! function per level that logs one preformatted string as `%{public}s`; Rust
//! keeps the formatting. Every line is public: it names executables, rules,
//! verdicts and results, which is what admins read.
//!
//! # Levels
//!
//! | tracing | macOS `os_log` type | Linux syslog |
//! |---|---|---|
//! | ERROR | error | `LOG_ERR` |
//! | WARN | default | `LOG_WARNING` |
//! | INFO | default (persisted, shown without `--info`) | `LOG_NOTICE` |
//! | DEBUG | info (`log show --info`) | `LOG_INFO` |
//! | TRACE | debug (`log show --debug`) | `LOG_DEBUG` |
//! | a panic ([`UnifiedLogLayer::new`] installs the hook) | fault | `LOG_CRIT` |
//!
//! # For admins
//!
//! ```text
//! log show --predicate 'subsystem == "com.metalift"' --last 1h          # macOS
//! log show --predicate 'subsystem == "com.metalift"' --last 1h --info   # with DEBUG
//! log show --predicate 'subsystem == "com.metalift" && category == "daemon"' --last 1h
//! log stream --predicate 'subsystem == "com.metalift"'                  # live
//! journalctl -t metaliftd --since -1h                                   # Linux
//! ```
//!
//! Categories: `daemon` (metaliftd), `shim` (libmetalift in injected processes).
//! The audit trail is *not* here: decisions and outcomes go to the audit log
//! (JSON Lines). This layer carries the daemon's own diagnostics; metaliftd has
//! no stderr file under launchd, so panics are routed here too.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Longest line handed to the system log; the unified log truncates near 1 KiB anyway.
const MAX_LINE: usize = 2048;

/// The unified log's subsystem for everything metalift writes.
pub const SUBSYSTEM: &CStr = c"com.metalift";
/// The daemon's category (the shim logs as `shim`).
pub const CATEGORY: &CStr = c"daemon";

/// How loud one line is, for the system log (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// A bug: a panic.
    Fault,
    /// A failure an admin must act on.
    Error,
    /// Worth keeping (WARN and INFO): persisted, shown by default.
    Default,
    /// DEBUG: kept in memory, `log show --info`.
    Info,
    /// TRACE.
    Debug,
}

/// The severity of a tracing level.
#[must_use]
pub fn severity(level: Level) -> Severity {
    match level {
        Level::ERROR => Severity::Error,
        Level::WARN | Level::INFO => Severity::Default,
        Level::DEBUG => Severity::Info,
        Level::TRACE => Severity::Debug,
    }
}

/// Sends every event to the system log (the unified log on macOS).
#[derive(Debug)]
pub struct UnifiedLogLayer {
    sink: sys::Sink,
}

impl UnifiedLogLayer {
    /// Opens the system log: on macOS an `os_log` handle for [`SUBSYSTEM`] /
    /// [`CATEGORY`]; elsewhere `openlog(ident)`, facility `LOG_DAEMON`, with the pid.
    /// Also installs a panic hook (chained to the previous one) that writes the
    /// panic as a fault: under launchd metaliftd has no stderr file.
    #[must_use]
    pub fn new(ident: &'static CStr) -> Self {
        let sink = sys::Sink::open(ident);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            sys::Sink::open(ident).write(Severity::Fault, &into_c_line(format!("panic: {info}")));
            previous(info);
        }));
        UnifiedLogLayer { sink }
    }
}

impl<S: Subscriber> Layer<S> for UnifiedLogLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let line = format_event(event);
        self.sink.write(severity(*event.metadata().level()), &line);
    }
}

/// The syslog priority for a severity (Linux; see the module's table).
#[must_use]
pub fn syslog_priority(severity: Severity) -> libc::c_int {
    match severity {
        Severity::Fault => libc::LOG_CRIT,
        Severity::Error => libc::LOG_ERR,
        Severity::Default => libc::LOG_NOTICE,
        Severity::Info => libc::LOG_INFO,
        Severity::Debug => libc::LOG_DEBUG,
    }
}

#[cfg(target_os = "macos")]
mod sys {
    //! `os_log` through `daemon/c/oslog.c` (declared in `daemon/c/metalift_oslog.h`).
    use std::ffi::{c_char, c_void, CStr};

    use super::{Severity, CATEGORY, SUBSYSTEM};

    unsafe extern "C" {
        fn metalift_oslog_create(subsystem: *const c_char, category: *const c_char) -> *mut c_void;
        fn metalift_oslog_default(log: *mut c_void, message: *const c_char);
        fn metalift_oslog_info(log: *mut c_void, message: *const c_char);
        fn metalift_oslog_debug(log: *mut c_void, message: *const c_char);
        fn metalift_oslog_error(log: *mut c_void, message: *const c_char);
        fn metalift_oslog_fault(log: *mut c_void, message: *const c_char);
    }

    /// An `os_log_t`, never released (libSystem keeps them for the process's life).
    #[derive(Debug)]
    pub struct Sink(*mut c_void);

    // SAFETY: os_log handles are immutable and documented as usable from any thread.
    unsafe impl Send for Sink {}
    // SAFETY: as above; logging through a shared handle is thread-safe.
    unsafe impl Sync for Sink {}

    impl Sink {
        pub fn open(_ident: &'static CStr) -> Sink {
            // SAFETY: two NUL-terminated 'static strings; returns a handle (never NULL).
            Sink(unsafe { metalift_oslog_create(SUBSYSTEM.as_ptr(), CATEGORY.as_ptr()) })
        }

        pub fn write(&self, severity: Severity, line: &CStr) {
            let log = match severity {
                Severity::Fault => metalift_oslog_fault,
                Severity::Error => metalift_oslog_error,
                Severity::Default => metalift_oslog_default,
                Severity::Info => metalift_oslog_info,
                Severity::Debug => metalift_oslog_debug,
            };
            // SAFETY: a live handle and a NUL-terminated string, logged as
            // "%{public}s" by the C side (never read as a format).
            unsafe { log(self.0, line.as_ptr()) };
        }
    }
}

#[cfg(not(target_os = "macos"))]
mod sys {
    //! `syslog(3)`: the journal or syslogd.
    use std::ffi::CStr;

    use super::{syslog_priority, Severity};

    /// Holds the identity `openlog` keeps a pointer to: it must outlive every
    /// `syslog` call ('static says so; the field documents it).
    #[derive(Debug)]
    pub struct Sink {
        _ident: &'static CStr,
    }

    impl Sink {
        pub fn open(ident: &'static CStr) -> Sink {
            // SAFETY: `ident` is 'static, as openlog(3) keeps the pointer.
            unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
            Sink { _ident: ident }
        }

        pub fn write(&self, severity: Severity, line: &CStr) {
            // SAFETY: a constant "%s" format with exactly one NUL-terminated string
            // argument, so no text from the event is ever read as a format.
            unsafe { libc::syslog(syslog_priority(severity), c"%s".as_ptr(), line.as_ptr()) };
        }
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

/// `../macos/panic_boundary.rs` is plain Rust, used on macOS only: compiled here in
/// test builds so its unit tests run on Linux too.
#[cfg(all(test, not(target_os = "macos")))]
#[path = "../macos/panic_boundary.rs"]
mod panic_boundary_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_so_that_info_is_persisted_and_debug_is_not() {
        assert_eq!(severity(Level::ERROR), Severity::Error);
        assert_eq!(severity(Level::WARN), Severity::Default);
        assert_eq!(severity(Level::INFO), Severity::Default);
        assert_eq!(severity(Level::DEBUG), Severity::Info);
        assert_eq!(severity(Level::TRACE), Severity::Debug);
        assert_eq!(syslog_priority(Severity::Error), libc::LOG_ERR);
        assert_eq!(syslog_priority(Severity::Default), libc::LOG_NOTICE);
        assert_eq!(syslog_priority(Severity::Info), libc::LOG_INFO);
        assert_eq!(syslog_priority(Severity::Fault), libc::LOG_CRIT);
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
