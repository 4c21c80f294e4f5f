//! `metalift validate`.

/// Arguments of `metalift validate`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `metalift validate`.
pub fn run(_args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("metalift validate is not built yet")
}
