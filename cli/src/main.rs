//! `metalift`: the admin CLI. Thin: parsing and dispatch only; the work is in `metalift_cli`.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use metalift_cli as cli;

/// Manage metalift: check policies, explain verdicts, read the audit log.
#[derive(Debug, Parser)]
#[command(name = "metalift", version, after_help = cli::reference::exit_status_help())]
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
    /// Answers from the audit log: one line per process (decision joined with outcome), filters, summary.
    Audit(Box<cli::audit::Args>),
    /// Run a command with libmetalift injected (--require-unlock: fail unless it was unlocked).
    Exec(cli::exec::Args),
    /// Start a throw-away daemon and show the shim's effect on the probe, end to end.
    Demo(cli::demo::Args),
    /// Edit the policy safely (visudo-style): lock, edit a copy, validate, install atomically.
    Edit(cli::edit::Args),
    /// Check the installation: daemon, policy, audit log, shim, SIP, injection, rules' executables.
    Doctor(cli::doctor::Args),
    /// Run a profile's kernels on this machine (under the shim) and record the result for require_verified.
    Verify(cli::verify::Args),
    /// What the GPU answers with no unlock (families, threadgroup memory, name and class), the host chip, and which profiles it already meets.
    Gpu(cli::gpu::Args),
    /// Print the JSON Schema of a policy file (for taplo / Even Better TOML).
    Schema(cli::schema::Args),
    /// Print the shell completion script for bash, zsh or fish.
    Completions(cli::completions::Args),
    /// Write the man pages and completion scripts under DIR (for the repository and the .pkg).
    #[command(name = "__generate-docs", hide = true)]
    GenerateDocs {
        /// The directory to write man/ and completions/ into.
        dir: std::path::PathBuf,
    },
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
        Command::Audit(a) => cli::audit::run(*a),
        Command::Exec(a) => cli::exec::run(a),
        Command::Demo(a) => cli::demo::run(a),
        Command::Edit(a) => cli::edit::run(a),
        Command::Doctor(a) => cli::doctor::run(a),
        Command::Verify(a) => cli::verify::run(a),
        Command::Gpu(a) => cli::gpu::run(a),
        Command::Schema(a) => cli::schema::run(a),
        Command::Completions(a) => cli::completions::run(&a, Cli::command()),
        Command::GenerateDocs { dir } => cli::docs::generate(
            Cli::command(),
            metalift_daemon::service::config::DaemonArgs::command(),
            &dir,
        )
        .map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => cli::report::error(&err, json),
    }
}
