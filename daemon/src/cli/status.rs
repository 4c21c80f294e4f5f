//! `metalift status`.

/// Arguments of `metalift status`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `metalift status`.
pub fn run(_args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("metalift status is not built yet")
}
