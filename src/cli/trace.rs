//! `fcp trace ...` (placeholder until the trace module lands).

/// Trace commands.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {}

pub fn run(_args: TraceArgs) -> anyhow::Result<()> {
    anyhow::bail!("trace commands are not built yet")
}
