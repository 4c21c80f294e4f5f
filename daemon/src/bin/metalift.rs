//! `metalift`: the admin CLI. Thin: parsing and dispatch only; the work is in `metalift_daemon::cli`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use metalift_daemon::cli;

/// Manage metalift: check policies, explain verdicts, read the audit log.
#[derive(Debug, Parser)]
#[command(name = "metalift", version, after_help = cli::report::EXIT_STATUS_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a policy file (and its policy.d/) and print every problem with its location.
    Validate(cli::validate::Args),
    /// Show which rule decides for an executable or a running process, and why.
    Explain(cli::explain::Args),
    /// Show the running daemon's policy and counters.
    Status(cli::status::Args),
    /// Read the audit log.
    Audit(cli::audit::Args),
    /// Run a command with libmetalift injected.
    Exec(cli::exec::Args),
    /// Start a throw-away daemon and show the shim's effect on the probe, end to end.
    Demo(cli::demo::Args),
    /// Edit the policy safely (visudo-style): lock, edit a copy, validate, install atomically.
    Edit(cli::edit::Args),
    /// Check the installation: daemon, policy, audit log, shim, SIP, injection, rules' executables.
    Doctor(cli::doctor::Args),
    /// Print the JSON Schema of a policy file (for taplo / Even Better TOML).
    Schema(cli::schema::Args),
}

fn main() -> ExitCode {
    cli::sigpipe::restore_default();
    let json = cli::report::wants_json(&std::env::args_os().collect::<Vec<_>>());
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return cli::report::usage(err, json),
    };
    let result = match cli.command {
        Command::Validate(a) => cli::validate::run(a),
        Command::Explain(a) => cli::explain::run(a),
        Command::Status(a) => cli::status::run(a),
        Command::Audit(a) => cli::audit::run(a),
        Command::Exec(a) => cli::exec::run(a),
        Command::Demo(a) => cli::demo::run(a),
        Command::Edit(a) => cli::edit::run(a),
        Command::Doctor(a) => cli::doctor::run(a),
        Command::Schema(a) => cli::schema::run(a),
    };
    match result {
        Ok(code) => code,
        Err(err) => cli::report::error(&err, json),
    }
}
