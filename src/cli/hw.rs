//! `fcp hw ...` (placeholder until the hardware module lands).

/// Hardware commands.
#[derive(Debug, clap::Args)]
pub struct HwArgs {}

pub fn run(_args: HwArgs) -> anyhow::Result<()> {
    anyhow::bail!("hardware commands are not built yet")
}
