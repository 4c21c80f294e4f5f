//! metaliftd's flags, their defaults, and the resolved [`Config`].
//!
//! Two stages: [`DaemonArgs`] is what clap parsed, with nothing checked or looked
//! up; [`DaemonArgs::resolve`] fills environment-dependent defaults (the socket
//! path depends on the effective uid and `$XDG_RUNTIME_DIR`) and validates, giving
//! a [`Config`] the daemon can run with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use metalift_policy::socket_path;

use crate::audit::Rotation;
use crate::checkin::transport::Limits;

/// The policy file read unless `--policy` says otherwise.
pub const DEFAULT_POLICY: &str = "/etc/metalift/policy.toml";
/// The socket a root daemon listens on unless `--socket` says otherwise
/// (`/var/run/...` on macOS; see [`metalift_policy::socket_path`]).
pub const DEFAULT_ROOT_SOCKET: &str = socket_path::SYSTEM_SOCKET;

/// metaliftd: decides, per executable, which processes see an unlocked Metal GPU.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "metaliftd", version)]
pub struct DaemonArgs {
    /// The policy file (`policy.d/*.toml` beside it is merged in name order).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_POLICY)]
    pub policy: PathBuf,

    /// The Unix socket to listen on [default: /run/metalift/metalift.sock as root,
    /// else $XDG_RUNTIME_DIR/metalift.sock; on macOS /var/run/metalift/metalift.sock
    /// as root, else metalift.sock in the user's own DARWIN_USER_TEMP_DIR].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// The audit log (JSON Lines).
    #[arg(long, value_name = "PATH", default_value = crate::audit::DEFAULT_LOG_PATH)]
    pub audit_log: PathBuf,

    /// Rotate the audit log when it would grow past this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Rotation::default().max_bytes)]
    pub audit_max_bytes: u64,

    /// Rotated audit files kept (`audit.jsonl.1` … `audit.jsonl.N`).
    #[arg(long, value_name = "N", default_value_t = Rotation::default().keep)]
    pub audit_keep: usize,

    /// Refuse a policy whose files (policy.toml and policy.d/*.toml together) hold
    /// more than this many bytes, like any broken policy: the last good one stays live.
    #[arg(long, value_name = "BYTES", default_value_t = metalift_policy::DEFAULT_MAX_POLICY_BYTES)]
    pub max_policy_bytes: u64,

    /// DEVELOPMENT ONLY: accept a policy file not owned by root or writable by others.
    #[arg(long)]
    pub allow_insecure_owner: bool,

    /// Accepted connections still waiting for their first frame (each for at most
    /// --first-frame-timeout-ms), all users together; one user holds at most a
    /// quarter: its newest, each past that closing its oldest.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pending)]
    pub max_pending_connections: usize,

    /// How long a new connection may take to send its first frame, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = duration_ms(Limits::default().first_frame_timeout))]
    pub first_frame_timeout_ms: u64,

    /// Connections being read or answered at once; further clients wait to be accepted.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_active)]
    pub max_connections: usize,

    /// Answered connections kept open for the shim's outcome report; past this an
    /// answered connection is closed (its outcome is then not recorded).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_waiting)]
    pub max_waiting_outcomes: usize,

    /// How long a client may take to send one complete frame, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = duration_ms(Limits::default().read_timeout))]
    pub read_timeout_ms: u64,

    /// How long an answered connection may stay silent before its outcome report
    /// starts, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = Limits::default().outcome_idle.as_secs())]
    pub outcome_idle_secs: u64,

    /// Executable hashes kept in the identity cache.
    #[arg(long, value_name = "N", default_value_t = crate::checkin::identity_cache::DEFAULT_CAPACITY)]
    pub cache_entries: usize,

    /// Also send diagnostics to the system log, syslog(3): the journal or syslogd
    /// on Linux. Always on on macOS, where it is the unified log.
    #[arg(long)]
    pub syslog: bool,

    /// BENCHMARKS ONLY: identify every Unix-socket peer on the blocking pool, as
    /// metaliftd did before identification that reads only kernel memory ran
    /// inline (`metalift-bench identity-hop` compares both in one run).
    #[arg(long, hide = true)]
    pub identify_on_blocking_pool: bool,

    /// The XPC mach service to serve (must be in the launchd job's `MachServices`).
    #[cfg(target_os = "macos")]
    #[arg(long, value_name = "NAME", default_value = crate::checkin::transport::xpc::DEFAULT_SERVICE)]
    pub mach_service: String,

    /// Decide no check-in over XPC: the mach service is still claimed, and each
    /// XPC check-in is answered "use the socket" at once (the shim then checks in
    /// on the Unix socket within its deadline).
    #[cfg(target_os = "macos")]
    #[arg(long)]
    pub no_xpc: bool,
}

/// Everything metaliftd needs to run, resolved and checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// The policy file.
    pub policy: PathBuf,
    /// The socket path.
    pub socket: PathBuf,
    /// The audit log.
    pub audit_log: PathBuf,
    /// Audit log rotation.
    pub rotation: Rotation,
    /// Accept a policy not owned by root (development).
    pub allow_insecure_owner: bool,
    /// The most bytes the policy's files may hold together.
    pub max_policy_bytes: u64,
    /// Connection limits.
    pub limits: Limits,
    /// Identity cache capacity.
    pub cache_entries: usize,
    /// The XPC mach service to claim beside the socket (always on macOS: launchd
    /// keeps the port either way, and a shim must get an answer); `None` elsewhere.
    pub mach_service: Option<String>,
    /// Whether XPC check-ins are decided (`false`: `--no-xpc`, each is answered
    /// "use the socket").
    pub xpc_identities: bool,
    /// Identify every socket peer on the blocking pool (benchmarks only).
    pub identify_on_blocking_pool: bool,
}

/// A flag combination metaliftd cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not root, no `--socket`, and no private directory to put the socket in
    /// (`$XDG_RUNTIME_DIR` on Linux, `confstr(_CS_DARWIN_USER_TEMP_DIR)` on macOS).
    #[error(
        "no --socket given and {} names no directory (a non-root daemon puts its socket there)",
        socket_path::PRIVATE_DIR
    )]
    NoRuntimeDir,
    /// A limit is zero.
    #[error("--{0} must be greater than 0")]
    Zero(&'static str),
}

impl DaemonArgs {
    /// Whether diagnostics also go to the system log.
    #[must_use]
    pub fn wants_syslog(&self) -> bool {
        self.syslog || cfg!(target_os = "macos")
    }

    /// Fills the defaults that depend on the environment and checks the limits.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let socket = match self.socket {
            Some(s) => s,
            None => {
                let uid = rustix::process::geteuid().as_raw();
                // Root never needs (nor creates, as confstr would) a private directory.
                default_socket(uid, if uid == 0 { None } else { user_private_dir() })?
            }
        };
        for (name, value) in [
            ("max-connections", self.max_connections as u64),
            (
                "max-pending-connections",
                self.max_pending_connections as u64,
            ),
            ("first-frame-timeout-ms", self.first_frame_timeout_ms),
            ("read-timeout-ms", self.read_timeout_ms),
            ("outcome-idle-secs", self.outcome_idle_secs),
            ("max-policy-bytes", self.max_policy_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        Ok(Config {
            // Absolute, as written in the audit log and reported to `metalift
            // status`/`doctor`: a relative path means nothing to a reader in
            // another directory (`absolute` only fails on an empty path).
            policy: std::path::absolute(&self.policy).unwrap_or(self.policy),
            socket,
            audit_log: std::path::absolute(&self.audit_log).unwrap_or(self.audit_log),
            rotation: Rotation {
                max_bytes: self.audit_max_bytes,
                keep: self.audit_keep,
            },
            allow_insecure_owner: self.allow_insecure_owner,
            max_policy_bytes: self.max_policy_bytes,
            limits: Limits {
                max_pending: self.max_pending_connections,
                first_frame_timeout: Duration::from_millis(self.first_frame_timeout_ms),
                max_active: self.max_connections,
                max_waiting: self.max_waiting_outcomes,
                read_timeout: Duration::from_millis(self.read_timeout_ms),
                outcome_idle: Duration::from_secs(self.outcome_idle_secs),
            },
            cache_entries: self.cache_entries,
            #[cfg(target_os = "macos")]
            mach_service: Some(self.mach_service),
            #[cfg(not(target_os = "macos"))]
            mach_service: None,
            #[cfg(target_os = "macos")]
            xpc_identities: !self.no_xpc,
            #[cfg(not(target_os = "macos"))]
            xpc_identities: false,
            identify_on_blocking_pool: self.identify_on_blocking_pool,
        })
    }
}

/// The socket path when `--socket` is not given, for a daemon running as `uid`
/// with the user's private directory `private_dir` ([`user_private_dir`]):
/// root: the system socket; a user: that user's own, per `socket_path`. Used by
/// `metalift` too.
pub fn default_socket(
    uid: u32,
    private_dir: Option<std::ffi::OsString>,
) -> Result<PathBuf, ConfigError> {
    socket_path::daemon_socket_for(uid, private_dir.as_deref()).ok_or(ConfigError::NoRuntimeDir)
}

/// The socket a `metalift` command talks to without `--socket`: the system
/// daemon's when it exists (as the shim chooses), else the current user's.
pub fn default_client_socket() -> Result<PathBuf, ConfigError> {
    let system_exists = Path::new(DEFAULT_ROOT_SOCKET).exists();
    let uid = rustix::process::geteuid().as_raw();
    let private_dir = if system_exists || uid == 0 {
        None
    } else {
        user_private_dir()
    };
    client_socket(system_exists, uid, private_dir)
}

/// The current user's private directory, where a per-user daemon's socket lives
/// (`metalift_policy::socket_path`): `$XDG_RUNTIME_DIR` on Linux; on macOS
/// `confstr(_CS_DARWIN_USER_TEMP_DIR)`, never an environment variable (any
/// process may set one to a directory another user controls).
#[must_use]
pub fn user_private_dir() -> Option<std::ffi::OsString> {
    #[cfg(target_os = "macos")]
    {
        crate::macos::user_temp_dir::darwin_user_temp_dir()
    }
    #[cfg(not(target_os = "macos"))]
    {
        std::env::var_os("XDG_RUNTIME_DIR")
    }
}

fn client_socket(
    system_exists: bool,
    uid: u32,
    runtime_dir: Option<std::ffi::OsString>,
) -> Result<PathBuf, ConfigError> {
    if system_exists {
        return Ok(PathBuf::from(DEFAULT_ROOT_SOCKET));
    }
    default_socket(uid, runtime_dir)
}

/// metaliftd's log filter from `RUST_LOG`: `level` and `target=level` directives,
/// comma-separated (e.g. `info,metalift_daemon::live_policy::watcher=debug`); `info` when unset
/// or unparsable.
///
/// Not `tracing_subscriber::EnvFilter`: its `env-filter` feature pulls in
/// `matchers`, which enables regex-automata's `dfa-build` feature for the whole
/// binary, and then globset compiles every path glob of the policy into a full
/// DFA: at 10,000 rules (2,000 globs) that made a policy load 3.6× slower
/// (75 → 275 ms) and the compiled policy 60% larger (28.8 → 46.6 MiB).
#[must_use]
pub fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    rust_log
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn root_listens_in_run_and_users_in_their_runtime_dir() {
        assert_eq!(
            default_socket(0, None).unwrap(),
            PathBuf::from(DEFAULT_ROOT_SOCKET)
        );
        assert_eq!(
            default_socket(501, Some("/run/user/501".into())).unwrap(),
            PathBuf::from("/run/user/501/metalift.sock")
        );
        assert!(matches!(
            default_socket(501, None),
            Err(ConfigError::NoRuntimeDir)
        ));
    }

    #[test]
    fn commands_talk_to_the_system_daemon_when_it_listens() {
        let user = || Some("/run/user/501".into());
        assert_eq!(
            client_socket(true, 501, user()).unwrap(),
            PathBuf::from(DEFAULT_ROOT_SOCKET)
        );
        assert_eq!(
            client_socket(false, 501, user()).unwrap(),
            PathBuf::from("/run/user/501/metalift.sock")
        );
    }

    #[test]
    fn flags_override_the_defaults() {
        let config = DaemonArgs::parse_from([
            "metaliftd",
            "--policy",
            "/tmp/p.toml",
            "--socket",
            "/tmp/s.sock",
            "--audit-log",
            "/tmp/a.jsonl",
            "--audit-keep",
            "2",
            "--read-timeout-ms",
            "250",
            "--max-connections",
            "3",
        ])
        .resolve()
        .unwrap();
        assert_eq!(config.policy, PathBuf::from("/tmp/p.toml"));
        assert_eq!(config.socket, PathBuf::from("/tmp/s.sock"));
        assert_eq!(config.rotation.keep, 2);
        assert_eq!(config.limits.read_timeout, Duration::from_millis(250));
        assert_eq!(config.limits.max_active, 3);
        assert!(!config.allow_insecure_owner);
    }

    #[test]
    fn rust_log_sets_levels_per_target_and_defaults_to_info() {
        use tracing_subscriber::filter::LevelFilter;
        let f = log_filter(Some("warn,metalift_daemon::live_policy::watcher=debug"));
        assert_eq!(f.default_level(), Some(LevelFilter::WARN));
        assert!(f.would_enable(
            "metalift_daemon::live_policy::watcher",
            &tracing::Level::DEBUG
        ));
        assert!(!f.would_enable("metalift_daemon::checkin::server", &tracing::Level::INFO));
        let f = log_filter(None);
        assert_eq!(f.default_level(), Some(LevelFilter::INFO));
    }

    #[test]
    fn a_zero_read_timeout_is_refused() {
        let args =
            DaemonArgs::parse_from(["metaliftd", "--socket", "/s", "--read-timeout-ms", "0"]);
        assert!(matches!(
            args.resolve(),
            Err(ConfigError::Zero("read-timeout-ms"))
        ));
    }
}
