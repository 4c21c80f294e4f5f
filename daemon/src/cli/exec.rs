//! `metalift exec`.

/// Arguments of `metalift exec`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `metalift exec`.
pub fn run(_args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("metalift exec is not built yet")
}
