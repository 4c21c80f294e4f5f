//! `metalift demo`.

/// Arguments of `metalift demo`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `metalift demo`.
pub fn run(_args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("metalift demo is not built yet")
}
