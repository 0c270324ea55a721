//! `fcp ablation`: FCP's components added one by one (seed §6.5, Table 2), simulated.

use super::trace::WlbHints;
use anyhow::{bail, Result};
use clap::Args;

use fcp::report::{ablation, ablation_table};
use fcp::sim::Simulator;

use super::common::{profile_words, BatchArgs, ProfileArgs};

/// Arguments of `fcp ablation`.
#[derive(Debug, Args)]
pub struct AblationArgs {
    #[command(flatten)]
    batch: BatchArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    /// The FCP entry the rows start from (its switches are set row by row), e.g. `fcp:block=2048`.
    #[arg(long, default_value = "fcp")]
    scheme: String,
    /// Number of batches (from the start of the packed trace).
    #[arg(long, default_value_t = 1)]
    batches: usize,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: AblationArgs) -> Result<()> {
    if a.batches == 0 {
        bail!("--batches must be at least 1");
    }
    if fcp::planners::SchemeSpec::parse(&a.scheme)?.name != "fcp" {
        bail!(
            "--scheme must be an fcp entry (`fcp` or `fcp:block=...`), not `{}`",
            a.scheme
        );
    }
    let (hw, model) = a.profile.load()?;
    let packed = a.batch.load(a.batches, WlbHints::new(&model, None))?;
    packed.note_all_cuts();
    let batches = packed.batches;
    let sim = Simulator::new(hw.clone(), model.clone())?;
    let ctx = a.batch.ctx(&hw, &model);
    let rows = ablation(&batches, &ctx, &sim, &a.scheme).map_err(anyhow::Error::msg)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        outln!(
            "{} batch(es) · {} ranks × {} tokens · {} · {}",
            batches.len(),
            a.batch.ranks,
            a.batch.tokens_per_rank(),
            profile_words(&hw, &model),
            a.batch.mask_name()
        );
        out!("{}", ablation_table(&rows));
    }
    Ok(())
}
