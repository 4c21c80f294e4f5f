//! `metalift status`: what the running daemon serves, in counts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::status::{self, StatusError};

/// How long to wait for the daemon's answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `metalift status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The daemon's socket [default: the system daemon's socket when it exists
    /// (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS),
    /// else the user's ($XDG_RUNTIME_DIR/metalift.sock; on macOS
    /// /Users/Shared/metalift/metalift.sock)].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print the daemon's JSON report instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `metalift status`: exit 0 with the report, 2 when no daemon answers.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let socket = match args.socket {
        Some(s) => s,
        None => crate::config::default_client_socket()?,
    };
    let result = if args.json {
        status::request_raw(&socket, TIMEOUT).map(|json| format!("{json}\n"))
    } else {
        status::request(&socket, TIMEOUT).map(|report| report.to_text())
    };
    match result {
        Ok(text) => {
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(err @ StatusError::NotRunning { .. }) => {
            eprintln!("metalift: {err}");
            Ok(ExitCode::from(2))
        }
        Err(err) => Err(err.into()),
    }
}
