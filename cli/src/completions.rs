//! `metalift completions SHELL`: the shell completion script, generated from the
//! same clap definitions that parse the command line.

use std::io::Write;
use std::process::ExitCode;

use clap_complete::Shell;

/// Arguments of `metalift completions`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Installed by the .pkg (load them from your shell's startup files otherwise):
  bash  /usr/local/etc/bash_completion.d/metalift
  zsh   /usr/local/share/zsh/site-functions/_metalift
  fish  /usr/local/share/fish/vendor_completions.d/metalift.fish

Exit status:
  0  printed")]
pub struct Args {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Writes the completion script for `shell` to `out`; `cmd` is the whole CLI.
pub fn write(shell: Shell, cmd: &mut clap::Command, out: &mut dyn Write) {
    clap_complete::generate(shell, cmd, "metalift", out);
}

/// Runs `metalift completions`.
pub fn run(args: &Args, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    write(args.shell, &mut cmd, &mut out);
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
