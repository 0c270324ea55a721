//! `fcp demo`: the README's main command. Packs the bundled trace (or `--trace`), plans the
//! first batches with every scheme, verifies every plan and prints how balanced each scheme
//! leaves the ranks, with the scheme to use.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use fcp::plan::{summarize, verify};
use fcp::planners::{planner_for, PlanContext, SCHEMES};

use super::common::{bytes, BatchArgs, MaskArg, ProfileArgs};
use super::trace::PackArgs;

/// Arguments of `fcp demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Trace file; defaults to the bundled trace.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// CP group size N.
    #[arg(long, default_value_t = 16)]
    ranks: u32,
    /// Tokens per rank.
    #[arg(long, default_value_t = 32768)]
    tokens_per_rank: u64,
    /// Number of batches to plan.
    #[arg(long, default_value_t = 4)]
    batches: usize,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
}

/// One scheme's averages over the planned batches.
#[derive(Debug, serde::Serialize)]
struct Row {
    scheme: String,
    verified: bool,
    max_over_mean: f64,
    flops_imbalance: f64,
    comm_bytes_total: f64,
    max_rank_bytes: f64,
    steps: f64,
    tasks: f64,
}

pub fn run(a: DemoArgs) -> Result<()> {
    let batch_args = BatchArgs {
        trace: a.trace.clone(),
        ranks: a.ranks,
        tokens_per_rank: a.tokens_per_rank,
        pack: PackArgs::default(),
        mask: MaskArg::Causal,
    };
    let packed = batch_args.load()?;
    let (hw, model) = a.profile.load()?;
    let ctx = PlanContext {
        ranks: a.ranks,
        tokens_per_rank: a.tokens_per_rank,
        mask: batch_args.mask.into(),
        model: &model,
        hardware: &hw,
    };
    let batches: Vec<_> = packed.batches.iter().take(a.batches.max(1)).collect();
    let mut rows = Vec::new();
    for &scheme in SCHEMES {
        let planner = planner_for(scheme)?;
        let mut row = Row {
            scheme: scheme.to_string(),
            verified: true,
            max_over_mean: 0.0,
            flops_imbalance: 0.0,
            comm_bytes_total: 0.0,
            max_rank_bytes: 0.0,
            steps: 0.0,
            tasks: 0.0,
        };
        for b in &batches {
            let plan = planner
                .plan(b, &ctx)
                .with_context(|| format!("{scheme}: planning batch {}", b.index))?;
            row.verified &= verify(&plan).is_empty();
            let s = summarize(&plan, &model);
            let k = batches.len() as f64;
            row.max_over_mean += s.max_over_mean / k;
            row.flops_imbalance += s.flops_imbalance / k;
            row.comm_bytes_total += s.comm_bytes_total as f64 / k;
            let max_rank = s
                .per_rank
                .iter()
                .map(|r| r.bytes_sent + r.bytes_recv)
                .max()
                .unwrap_or(0);
            row.max_rank_bytes += max_rank as f64 / k;
            row.steps += s.steps as f64 / k;
            row.tasks += s.tasks as f64 / k;
        }
        rows.push(row);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let tokens: u64 = batches.iter().map(|b| b.tokens()).sum();
    let docs: usize = batches.iter().map(|b| b.doc_lens.len()).sum();
    println!(
        "{} batch(es) of {} · {} docs, {} tokens · {} ranks × {} tokens · {} / {} · causal",
        batches.len(),
        a.trace
            .as_ref()
            .map_or("the bundled trace".to_string(), |p| p.display().to_string()),
        docs,
        tokens,
        a.ranks,
        a.tokens_per_rank,
        hw.name,
        model.name
    );
    println!(
        "{:<10} {:>8} {:>13} {:>11} {:>14} {:>14} {:>6} {:>8}",
        "scheme",
        "verified",
        "FLOPs max/mean",
        "imbalance",
        "comm/batch",
        "busiest rank",
        "steps",
        "tasks"
    );
    for r in &rows {
        println!(
            "{:<10} {:>8} {:>13.3} {:>10.1}% {:>14} {:>14} {:>6.0} {:>8.0}",
            r.scheme,
            if r.verified { "yes" } else { "NO" },
            r.max_over_mean,
            100.0 * r.flops_imbalance,
            bytes(r.comm_bytes_total as u64),
            bytes(r.max_rank_bytes as u64),
            r.steps,
            r.tasks
        );
    }
    let best = rows
        .iter()
        .min_by(|x, y| x.max_over_mean.total_cmp(&y.max_over_mean))
        .context("no scheme ran")?;
    let worst = rows
        .iter()
        .max_by(|x, y| x.max_over_mean.total_cmp(&y.max_over_mean))
        .context("no scheme ran")?;
    println!(
        "\nUse {}: its busiest rank does {:.2}× the mean attention work; with {} it does {:.2}×, so the other ranks idle up to {:.0}% of the attention time.",
        best.scheme,
        best.max_over_mean,
        worst.scheme,
        worst.max_over_mean,
        100.0 * worst.flops_imbalance
    );
    Ok(())
}
