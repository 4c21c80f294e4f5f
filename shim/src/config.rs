//! What the environment may tell the shim: where the daemon is, how long to wait,
//! whether to stay out of the way, whether to talk on stderr. Nothing here can
//! unlock anything: every setting either selects whom to ask or makes the shim do
//! less. (`METALIFT_SOCKET` could name a daemon the user runs themselves; but
//! whoever controls a process's environment can already inject any library into
//! it, so that grants nothing new. metalift governs processes whose environment
//! the admin controls: launchd jobs, CI agents, `metalift exec`.)
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use metalift_policy::socket_path;

/// How long the first Metal device init waits for a verdict when
/// `METALIFT_TIMEOUT_MS` does not say otherwise.
///
/// The daemon answers in well under a millisecond from its identity cache and in
/// tens to a few hundred milliseconds when it must hash a large binary it has not
/// seen (first launch of a 50 MB `llama-server`), more on a loaded 2-core CI box.
/// 2 s covers that with a wide margin, while a hung daemon costs a Metal process
/// at most 2 s once, at its first device init — which itself takes hundreds of
/// milliseconds on a paravirtual GPU. Processes that never touch Metal never wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2000);

/// The largest wait `METALIFT_TIMEOUT_MS` may ask for: past this, a hung daemon
/// would look like a hung workload.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(10_000);

/// The shim's settings for this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// The hard deadline for the verdict, counted from the first device init.
    pub timeout: Duration,
    /// `METALIFT_DISABLE=1`: no check-in, no hooks, stock.
    pub disabled: bool,
    /// `METALIFT_DEBUG=1`: also write diagnostics to stderr.
    pub debug: bool,
    /// Problems with the environment itself (reported in debug mode and syslog).
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Config {
        Config::from_vars(
            |name| std::env::var_os(name),
            |path| std::path::Path::new(path).exists(),
        )
    }

    /// Builds the settings from `var` (an environment lookup) and `exists` (a file
    /// system probe), so tests need neither.
    pub fn from_vars(
        var: impl Fn(&str) -> Option<OsString>,
        exists: impl Fn(&str) -> bool,
    ) -> Config {
        let mut warnings = Vec::new();
        let flag = |name: &str| var(name).is_some_and(|v| v == "1");
        let socket = match var("METALIFT_SOCKET") {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => socket_path::client_socket(
                exists(socket_path::SYSTEM_SOCKET),
                var("XDG_RUNTIME_DIR").as_deref(),
            ),
        };
        let timeout = match var("METALIFT_TIMEOUT_MS") {
            None => DEFAULT_TIMEOUT,
            Some(raw) => match raw.to_str().and_then(|s| s.trim().parse::<u64>().ok()) {
                Some(ms) => Duration::from_millis(ms).min(MAX_TIMEOUT),
                None => {
                    warnings.push(format!(
                        "METALIFT_TIMEOUT_MS={} is not a number of milliseconds; using {} ms",
                        raw.to_string_lossy(),
                        DEFAULT_TIMEOUT.as_millis()
                    ));
                    DEFAULT_TIMEOUT
                }
            },
        };
        Config {
            socket,
            timeout,
            disabled: flag("METALIFT_DISABLE"),
            debug: flag("METALIFT_DEBUG"),
            warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)], system_socket_exists: bool) -> Config {
        Config::from_vars(
            |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            },
            |_| system_socket_exists,
        )
    }

    #[test]
    fn an_empty_environment_asks_the_default_daemon_with_the_default_deadline() {
        let c = config(&[], false);
        assert_eq!(c.socket, PathBuf::from(socket_path::SYSTEM_SOCKET));
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert!(!c.disabled && !c.debug);
    }

    #[test]
    fn the_user_socket_is_used_unless_a_system_daemon_listens() {
        let vars = [("XDG_RUNTIME_DIR", "/run/user/501")];
        assert_eq!(
            config(&vars, false).socket,
            PathBuf::from("/run/user/501/metalift.sock")
        );
        assert_eq!(
            config(&vars, true).socket,
            PathBuf::from(socket_path::SYSTEM_SOCKET)
        );
    }

    #[test]
    fn metalift_socket_overrides_the_defaults() {
        let c = config(&[("METALIFT_SOCKET", "/tmp/x.sock")], true);
        assert_eq!(c.socket, PathBuf::from("/tmp/x.sock"));
    }

    #[test]
    fn the_timeout_may_be_lowered_or_raised_but_not_past_the_cap() {
        let ms = |v: &str| config(&[("METALIFT_TIMEOUT_MS", v)], false).timeout;
        assert_eq!(ms("50"), Duration::from_millis(50));
        assert_eq!(ms("0"), Duration::ZERO);
        assert_eq!(ms("5000"), Duration::from_millis(5000));
        assert_eq!(ms("999999999"), MAX_TIMEOUT);
    }

    #[test]
    fn a_garbled_timeout_keeps_the_default_and_says_so() {
        let c = config(&[("METALIFT_TIMEOUT_MS", "soon")], false);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.warnings.len(), 1);
    }

    #[test]
    fn only_exactly_1_disables_or_enables_debug() {
        assert!(config(&[("METALIFT_DISABLE", "1")], false).disabled);
        assert!(!config(&[("METALIFT_DISABLE", "yes")], false).disabled);
        assert!(config(&[("METALIFT_DEBUG", "1")], false).debug);
        assert!(!config(&[("METALIFT_DEBUG", "0")], false).debug);
    }
}
