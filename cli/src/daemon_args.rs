//! The one way every command reaches metaliftd: `--socket PATH` (else
//! `$METALIFT_SOCKET`, else the platform default) and `--daemon-timeout SECONDS`,
//! `#[command(flatten)]`ed into each command that talks to the daemon, and the one
//! call that asks it ([`DaemonArgs::status`]; `crate::judgement::ask` judges the answer, over `metalift_policy::wire::Client`
//! via `metalift_daemon::service::status`). A command that needs the daemon
//! extends this group; it does not declare its own `--socket` or timeout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use metalift_daemon::service::config::{default_client_socket, ConfigError};
use metalift_daemon::service::status::{self, StatusError, StatusReport};

/// How long a command waits for the daemon's answer unless `--daemon-timeout`
/// says otherwise: it answers status from memory, so this only bounds a hung one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the daemon is and how long to wait for it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DaemonArgs {
    /// The daemon's socket [default: the system daemon's socket when it exists
    /// (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS),
    /// else the user's ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in
    /// the user's own DARWIN_USER_TEMP_DIR)].
    #[arg(long, value_name = "PATH", env = "METALIFT_SOCKET")]
    pub socket: Option<PathBuf>,
    /// How long to wait for the daemon's answer, in seconds [default: 5].
    #[arg(long = "daemon-timeout", value_name = "SECONDS")]
    pub daemon_timeout: Option<f64>,
}

impl DaemonArgs {
    /// The socket given (`--socket` or `$METALIFT_SOCKET`, not empty), not guessed.
    #[must_use]
    pub fn given(&self) -> Option<&Path> {
        self.socket.as_deref().filter(|s| !s.as_os_str().is_empty())
    }

    /// The socket to ask: the one given, else the platform default.
    ///
    /// # Errors
    /// When none is given and the default cannot be resolved (no runtime directory).
    pub fn socket(&self) -> Result<PathBuf, ConfigError> {
        match self.given() {
            Some(s) => Ok(s.to_owned()),
            None => default_client_socket(),
        }
    }

    /// The socket to ask, when one is known.
    #[must_use]
    pub fn known_socket(&self) -> Option<PathBuf> {
        self.socket().ok()
    }

    /// How long to wait for an answer.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.daemon_timeout
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64)
    }

    /// Asks the daemon on `socket` for its status: the one request every command makes.
    ///
    /// # Errors
    /// When it does not answer in time, or answers something that is not a status.
    pub fn status(&self, socket: &Path) -> Result<StatusReport, StatusError> {
        status::request(socket, self.timeout())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_socket_is_not_given_and_the_timeout_falls_back() {
        let args = DaemonArgs {
            socket: Some(PathBuf::new()),
            daemon_timeout: Some(0.0),
        };
        assert_eq!(args.given(), None);
        assert_eq!(args.timeout(), DEFAULT_TIMEOUT);
        let args = DaemonArgs {
            socket: Some("/s.sock".into()),
            daemon_timeout: Some(0.5),
        };
        assert_eq!(args.given(), Some(Path::new("/s.sock")));
        assert_eq!(args.timeout(), Duration::from_millis(500));
    }
}
