//! `fcp ablation`: FCP's components added one by one (the FCP paper's Table 2, §6.5), each row
//! planned and simulated on the same batches.

use serde::Serialize;

use crate::planners::{planner_for, PlanContext};
use crate::sim::{PassSel, Simulator};
use crate::trace::Batch;

use super::stats::mean;

/// The rows, in order: a name and the parameters that row adds to the FCP entry. Each row
/// keeps the switches of the rows above it.
/// `+traffic repair` is ours (not in the paper's table): the local search that evens out K/V
/// traffic after LPT (`planners::repair`).
pub const ABLATION_STEPS: [(&str, &str); 6] = [
    (
        "base",
        "pipeline=false,solver=false,coalescer=false,repair=false,reshuffle=false",
    ),
    ("+pipelining", "pipeline=true"),
    ("+solver", "solver=true"),
    ("+coalescer", "coalescer=true"),
    ("+traffic repair", "repair=true"),
    ("+reshuffler", "reshuffle=true"),
];

/// One row: means over the batches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AblationRow {
    /// Row name (`base`, `+pipelining`, ...).
    pub row: String,
    /// The full scheme entry planned (`fcp:block=4096,...`).
    pub scheme: String,
    /// Attention MFU of the forward pass simulated alone.
    pub mfu_fwd: f64,
    /// Attention MFU of the backward pass simulated alone.
    pub mfu_bwd: f64,
    /// Forward attention time, ms.
    pub fwd_ms: f64,
    /// Backward attention time, ms.
    pub bwd_ms: f64,
    /// Compute imbalance, forward and backward together.
    pub compute_imbalance: f64,
    /// Comm imbalance, forward and backward together.
    pub comm_imbalance: f64,
}

/// Run the ablation of `fcp` entry `base` (`fcp` or `fcp:block=2048,...`; its own switches are
/// overridden row by row) on `batches`.
pub fn ablation(
    batches: &[Batch],
    ctx: &PlanContext<'_>,
    sim: &Simulator,
    base: &str,
) -> Result<Vec<AblationRow>, String> {
    // The user's entry is checked as given, before any row overrides its switches: a bad
    // value (`pipeline=maybe`) every row replaces would otherwise pass unseen.
    planner_for(base).map_err(|e| e.to_string())?;
    let mut entry = crate::planners::SchemeSpec::parse(base).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for (name, add) in ABLATION_STEPS {
        for (k, v) in add.split(',').filter_map(|kv| kv.split_once('=')) {
            entry.set(k, v);
        }
        let spec = entry.to_string();
        let planner = planner_for(&spec).map_err(|e| e.to_string())?;
        let mut cols: [Vec<f64>; 6] = Default::default();
        for b in batches {
            let plan = planner
                .plan(b, ctx)
                .map_err(|e| format!("{name}: batch {}: {e}", b.index))?;
            let run = |p| {
                sim.simulate(&plan, p)
                    .map(|r| r.metrics)
                    .map_err(|e| format!("{name}: batch {}: {e}", b.index))
            };
            let (f, w, both) = (run(PassSel::Fwd)?, run(PassSel::Bwd)?, run(PassSel::Both)?);
            for (c, x) in cols.iter_mut().zip([
                f.mfu,
                w.mfu,
                f.attention_time_ms,
                w.attention_time_ms,
                both.compute_imbalance,
                both.comm_imbalance,
            ]) {
                c.push(x);
            }
        }
        rows.push(AblationRow {
            row: name.to_string(),
            scheme: spec.clone(),
            mfu_fwd: mean(&cols[0]),
            mfu_bwd: mean(&cols[1]),
            fwd_ms: mean(&cols[2]),
            bwd_ms: mean(&cols[3]),
            compute_imbalance: mean(&cols[4]),
            comm_imbalance: mean(&cols[5]),
        });
    }
    Ok(rows)
}

/// The ablation as a Markdown table (the paper's Table 2 layout plus times and imbalances).
pub fn ablation_table(rows: &[AblationRow]) -> String {
    let mut s = String::from(
        "| row | MFU fwd | MFU bwd | fwd ms | bwd ms | compute_imb | comm_imb |\n|---|---|---|---|---|---|---|\n",
    );
    let mut prev: Option<&AblationRow> = None;
    for r in rows {
        let gain = |now: f64, before: Option<f64>| match before {
            Some(b) if b > 0.0 => format!("{now:.3} ({:+.0}%)", 100.0 * (now / b - 1.0)),
            _ => format!("{now:.3}"),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.3} |\n",
            r.row,
            gain(r.mfu_fwd, prev.map(|p| p.mfu_fwd)),
            gain(r.mfu_bwd, prev.map(|p| p.mfu_bwd)),
            r.fwd_ms,
            r.bwd_ms,
            r.compute_imbalance,
            r.comm_imbalance
        ));
        prev = Some(r);
    }
    s
}
