//! `metalift audit`.

/// Arguments of `metalift audit`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `metalift audit`.
pub fn run(_args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("metalift audit is not built yet")
}
