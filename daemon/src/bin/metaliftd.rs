//! `metaliftd`: the policy service. Thin: flags, logging, runtime; the daemon is
//! `metalift_daemon::service`.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use metalift_daemon::service;
use metalift_daemon::service::config::DaemonArgs;

/// Exit status 78 (`EX_CONFIG`): the flags and environment give no usable configuration.
const EXIT_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let args = DaemonArgs::parse();
    init_logging(&args);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Through tracing, not eprintln: under launchd stderr goes nowhere, the
            // unified log layer is where an admin reads why the job keeps exiting.
            // The stderr layer prints the same single line for a person at a terminal.
            tracing::error!(
                "metaliftd: error: {}",
                metalift_daemon::service::error_chain::describe(&err)
            );
            ExitCode::from(exit_code(&err))
        }
    }
}

/// 73 socket, 74 audit log, 78 configuration, 1 anything else (documented in metaliftd(8)).
fn exit_code(err: &anyhow::Error) -> u8 {
    if let Some(failure) = err.downcast_ref::<service::StartFailure>() {
        failure.exit_code()
    } else if err
        .downcast_ref::<metalift_daemon::service::config::ConfigError>()
        .is_some()
    {
        EXIT_CONFIG
    } else {
        1
    }
}

/// Diagnostics to stderr (launchd's `StandardErrorPath`, systemd's journal) and,
/// when asked or on macOS, to the system log. `RUST_LOG` filters; default `info`.
fn init_logging(args: &DaemonArgs) {
    use tracing_subscriber::prelude::*;
    let filter =
        metalift_daemon::service::config::log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not in launchd's or journald's log files.
        .with_ansi(wants_colour(
            std::env::var_os("NO_COLOR").as_deref(),
            std::io::stderr().is_terminal(),
        ));
    let system = args
        .wants_syslog()
        .then(|| metalift_daemon::service::oslog::UnifiedLogLayer::new(c"metaliftd"));
    tracing_subscriber::registry()
        .with(filter)
        .with(stderr)
        .with(system)
        .init();
}

/// Colour on stderr: only at a terminal, and never when `NO_COLOR` is set to a
/// non-empty value (<https://no-color.org>).
fn wants_colour(no_color: Option<&std::ffi::OsStr>, stderr_is_terminal: bool) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn run(args: DaemonArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let stop = service::stop_signals()?;
        service::run(config, stop).await
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::wants_colour;

    #[test]
    fn no_color_turns_colour_off_even_at_a_terminal() {
        assert!(wants_colour(None, true));
        assert!(wants_colour(Some(OsStr::new("")), true));
        assert!(!wants_colour(Some(OsStr::new("1")), true));
        assert!(!wants_colour(None, false));
    }
}
