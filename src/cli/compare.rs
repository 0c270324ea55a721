//! `fcp compare`: plan and simulate several schemes on the same batches, side by side.

use super::trace::WlbHints;
use anyhow::{bail, Result};
use clap::Args;

use fcp::report::{
    compare, compare_csv, compare_table, parse_scheme_list, price_steps, CompareOptions,
};
use fcp::sim::Simulator;

use super::common::{
    judge, layer_sim, memory_sim, memory_words, overlap_words, plural, profile_words,
    recompute_words, repeats_note, step_words, BatchArgs, LeverArgs, PassArg, ProfileArgs,
    RecomputeArg, StepArgs, TrainingArgs,
};
use super::steps::{batches_wanted, from_words, whole_steps};

/// Arguments of `fcp compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    batch: BatchArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Schemes, comma-separated, each optionally with parameters (`ring,fcp:block=2048,coalesce=8`),
    /// or `all`.
    #[arg(long, default_value = "all")]
    schemes: Vec<String>,
    /// Number of batches (from the start of the packed trace, or from --from-batch; default
    /// 4, or with --steps every step's windows).
    #[arg(long)]
    batches: Option<usize>,
    /// Skip this many batches of the packed trace first: a later stretch of training, e.g.
    /// the second step of 8 micro-batches with `--from-batch 8 --batches 8`.
    #[arg(long, default_value_t = 0)]
    from_batch: usize,
    /// Scheme entry the speedup column is measured against (default: the first).
    #[arg(long)]
    baseline: Option<String>,
    /// Passes: fwd (inference), bwd, or both (training).
    #[arg(long, value_enum, default_value_t = PassArg::Both)]
    pass: PassArg,
    /// Print a JSON list: one object per scheme with `scheme` and the mean of every plan metric.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV.
    #[arg(long)]
    csv: bool,
    /// Also simulate the whole layer (projections and MLP around attention, as
    /// `fcp simulate --layer`): adds its time, speedup and token imbalance.
    #[arg(long)]
    layer: bool,
    /// With `--layer`: what the backward pass recomputes (none, mlp, full; as
    /// `fcp simulate --recompute`).
    #[arg(long, value_enum, requires = "layer")]
    recompute: Option<RecomputeArg>,
    /// With `--layer` under `--tp`: TP collectives overlap their GEMMs (as
    /// `fcp simulate --tp-overlap`).
    #[arg(long, requires = "layer")]
    tp_overlap: bool,
    /// With `--layer`: also count what the fullest GPU holds over a training step, in the
    /// fullest batch, against the hardware's `hbm_gb` (as `fcp simulate --memory`): adds the
    /// `mem/GPU` and `fits` columns.
    #[arg(long, requires = "layer")]
    memory: bool,
    #[command(flatten)]
    training: TrainingArgs,
    /// With `--memory`: a training step with the batches as its micro-batches, in order
    /// (adds `step_ms` and `tok/s/GPU`; each row's JSON a `step`; docs/cost-model.md
    /// § Training step).
    #[command(flatten)]
    step: StepArgs,
    /// With --micro-batches: price this many consecutive training steps, each on its own
    /// --micro-batches × --dp windows of the trace (from --from-batch on), and report their
    /// mean step time, the slowest, and the tokens per GPU-second over all of them (the JSON's
    /// `steps` and `over_steps`). --batches defaults to every step's windows. Under `--pack
    /// wlb` each is one of WLB's steps.
    #[arg(long, requires = "micro_batches")]
    steps: Option<usize>,
    #[command(flatten)]
    levers: LeverArgs,
}

pub fn run(a: CompareArgs) -> Result<()> {
    let schemes = parse_scheme_list(&a.schemes)?;
    if schemes.is_empty() {
        bail!("--schemes lists no scheme (give names, comma-separated, or `all`)");
    }
    if let Some(b) = &a.baseline {
        if !schemes.contains(b) {
            bail!(
                "--baseline `{b}` is not one of the compared schemes ({})",
                schemes.join(", ")
            );
        }
    }
    if a.batches == Some(0) {
        bail!("--batches must be at least 1");
    }
    if a.steps == Some(0) {
        bail!("--steps must be at least 1");
    }
    let training = a.training.when(a.memory)?;
    let step = a.step.step(training.unwrap_or_default())?;
    if step.is_some() && training.is_none() {
        bail!("--micro-batches prices a training step from the memory count's setting: it needs --layer --memory");
    }
    // As tpcp: refused up front, before any scheme is planned.
    if step.is_some() && a.pass != PassArg::Both {
        bail!(
            "a training step (--micro-batches) runs both passes: --pass {} leaves one out",
            fcp::sim::PassSel::from(a.pass).name()
        );
    }
    let step = a.levers.apply(step, training.unwrap_or_default())?;
    let dp = training.unwrap_or_default().dp;
    // The windows one step trains: --micro-batches on each of --dp replicas.
    let per_step = step.map(|o| usize::try_from(o.windows(dp)).unwrap_or(usize::MAX));
    let wanted = batches_wanted(a.batches, a.steps, step.map(|o| (o.micro_batches, dp)))?;
    let (hw, model) = a.profile.load()?;
    // WLB packing balances the windows of one training step together.
    let group = step.map(|o| u32::try_from(o.windows(dp)).unwrap_or(u32::MAX));
    let hints = WlbHints::new(&model, group);
    let mut packed = a.batch.load(a.from_batch.saturating_add(wanted), hints)?;
    packed.skip(a.from_batch)?;
    // `--steps S`: S steps (the whole steps the trace holds, if fewer), each on its own
    // windows, reported as `steps` and `over_steps` whatever their number.
    let steps = match (a.steps, per_step) {
        (Some(s), Some(per)) => Some(whole_steps(
            &mut packed.batches,
            s,
            per,
            a.from_batch,
            ("batch", "batches"),
        )),
        _ => None,
    };
    if let (Some(per), fcp::trace::PackMode::Wlb(p)) = (per_step, a.batch.pack.mode(hints)) {
        super::common::wlb_alignment_note(p.group as usize, per, a.from_batch);
    }
    packed.note_all_cuts();
    let batches = packed.batches;
    let sim = layer_sim(
        Simulator::new(hw.clone(), model.clone())?,
        a.layer,
        a.recompute,
        a.tp_overlap,
    )?;
    let sim = memory_sim(sim, training, step)?;
    // `auto` and `hybrid` judge plans as they are simulated here.
    let ctx = fcp::planners::PlanContext {
        judge: judge(a.pass, a.layer, a.recompute, a.tp_overlap),
        ..a.batch.ctx(&hw, &model)
    };
    let opts = CompareOptions {
        schemes: schemes.clone(),
        baseline: a.baseline.clone(),
        verify: true,
    };
    let mut rows = compare(&batches, &ctx, &sim, &opts);
    if let Some(o) = step {
        price_steps(&mut rows, &batches, &sim, ctx.ranks, o, steps)?;
        let t = training.unwrap_or_default();
        let needed = o.windows(t.dp);
        // Bug hunt: batches left out of the step, or repeated in it, were not said.
        if steps.is_some() {
            // Each step has its own windows, every batch in one, or `whole_steps` said why
            // not.
        } else if (batches.len() as u64) < needed {
            // Bug hunt: advice to ask for the batches the trace does not hold.
            let advice = if batches.len() < wanted {
                format!("the trace holds no more{}", from_words(a.from_batch))
            } else {
                format!("--batches {needed} gives each its own")
            };
            repeats_note(
                needed,
                o.micro_batches,
                t.dp,
                batches.len(),
                ("batch", "batches"),
                &advice,
            );
        } else {
            super::steps::first_windows_note(
                needed,
                batches.len(),
                o.micro_batches,
                t.dp,
                "batches",
            );
        }
        a.levers.notes(t);
        // Bug hunt: said only of schemes that ran a step (none running is no evidence), the
        // steps `--steps` priced included.
        let ran: Vec<_> = rows.iter().flat_map(|r| r.priced.all()).collect();
        if o.dp_overlap && !ran.is_empty() && ran.iter().all(|s| s.dp_comm_ms == 0.0) {
            super::common::dp_overlap_idle_note("no scheme runs");
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else if a.csv {
        out!("{}", compare_csv(&rows));
    } else {
        outln!(
            "{} batch(es) · {} ranks × {} tokens · {} · {} · pass {}{}{}{}{}{}",
            batches.len(),
            a.batch.ranks,
            a.batch.tokens_per_rank(),
            profile_words(&hw, &model),
            a.batch.mask_name(),
            fcp::sim::PassSel::from(a.pass).name(),
            recompute_words(a.recompute),
            overlap_words(a.tp_overlap, &model),
            memory_words(training),
            step_words(step),
            steps.map_or(String::new(), |n| format!(
                " · {}",
                plural(n as u32, "step", "steps")
            ))
        );
        out!(
            "{}",
            compare_table(&rows, a.baseline.as_deref().unwrap_or(&schemes[0]))
        );
    }
    if let Some(first) = rows
        .iter()
        .find(|r| r.mean.is_none())
        .filter(|_| rows.iter().all(|r| r.mean.is_none()))
    {
        bail!(
            "no scheme could plan these batches (first: {}: {})",
            first.scheme,
            first.error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}
