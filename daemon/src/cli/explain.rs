//! `metalift explain`.

/// Arguments of `metalift explain`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `metalift explain`.
pub fn run(_args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("metalift explain is not built yet")
}
