//! `wlb-llm`: WLB-LLM's per-batch choice between per-sequence and per-document sharding.
//!
//! Source: Wang et al., "WLB-LLM: Workload-Balance 4D Parallelism for LLM Training" (OSDI'25,
//! arXiv 2503.17924; no official code, anchors-cp.md §4): per-document sharding balances causal
//! work but cuts short documents into tiny chunks the kernel runs inefficiently, so a runtime
//! selector estimates both shardings with a profile-guided model and runs the cheaper one. The
//! FCP paper (seed 000, §3.4 "Switch between two") runs it as a baseline. Here the two
//! candidates are [`Llama3`] (per-sequence: the packed sequence in 2N chunks) and [`PerDoc`], and
//! the estimate is the shared cost model ([`crate::hardware::cost`]) that the simulator uses:
//! per rank, the sum of every task's forward and backward tile time at its own shape (one launch
//! overhead per step and pass, a step being one varlen launch), plus the
//! all-gather (forward) and reduce-scatter (backward) of the rank's K/V over the link the group
//! spans; the plan's time is the slowest rank's. See `docs/schemes/wlb-llm.md`.

use crate::hardware::{tile_time_s, Pass};
use crate::plan::{allowed_pairs, summarize, Plan, PlanError};
use crate::trace::Batch;

use super::{Llama3, PerDoc, PlanContext, Planner};

/// Chooses per batch between per-sequence (llama3) and per-document sharding by estimated time.
#[derive(Debug, Clone, Copy, Default)]
pub struct WlbLlm;

/// Estimated forward + backward attention time of `plan` in seconds: the slowest rank's summed
/// tile times (each at its own shape's profiled efficiency, one launch overhead per step and
/// pass) plus its all-gather/reduce-scatter time.
pub(crate) fn estimate_s(plan: &Plan, ctx: &PlanContext<'_>) -> Result<f64, PlanError> {
    let cost = |e: crate::hardware::HardwareError| {
        PlanError::Planning(format!("{}: cost estimate failed: {e}", plan.scheme.name))
    };
    let profile = ctx.hardware.kernel_profile().map_err(cost)?;
    let link = if ctx.ranks <= ctx.hardware.gpus_per_node {
        ctx.hardware.intra_node_link()
    } else {
        ctx.hardware.inter_node_link()
    };
    let summary = summarize(plan, ctx.model);
    let mut worst = 0.0f64;
    for (rp, load) in plan.ranks.iter().zip(&summary.per_rank) {
        let mut t = 0.0;
        let launch = ctx.hardware.launch_overhead_s();
        for step in rp.steps.iter().filter(|s| !s.tasks.is_empty()) {
            // A step is one varlen launch per pass: one launch overhead, and each tile at the
            // efficiency of its own shape (small chunks run slowly; WLB-LLM's point).
            t += 2.0 * launch;
            for task in &step.tasks {
                let (q, kv) = (task.q, task.kv);
                let pairs = allowed_pairs(plan.mask, q.start, q.end, kv.start, kv.end);
                if pairs == 0 {
                    continue;
                }
                for pass in [Pass::Fwd, Pass::Bwd] {
                    let tile = tile_time_s(
                        ctx.hardware,
                        &profile,
                        ctx.model,
                        pass,
                        plan.mask,
                        q.len(),
                        kv.len(),
                        pairs,
                    )
                    .map_err(cost)?;
                    t += tile - launch;
                }
            }
        }
        if load.bytes_recv > 0 {
            // Forward all-gather, backward reduce-scatter of the same bytes.
            t += 2.0 * link.time_s(load.bytes_recv);
        }
        worst = worst.max(t);
    }
    Ok(worst)
}

impl Planner for WlbLlm {
    fn name(&self) -> &'static str {
        "wlb-llm"
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        // A candidate too large to plan leaves the other, which records why (bug hunt: per-doc
        // built 38 million tiles past the cap on 100,000 short documents, where llama3 was
        // chosen; now per-doc refuses, and wlb-llm must not refuse with it).
        let (per_seq, per_doc) = (Llama3.plan(batch, ctx), PerDoc.plan(batch, ctx));
        let (t_seq, t_doc) = (
            per_seq
                .as_ref()
                .ok()
                .map(|p| estimate_s(p, ctx))
                .transpose()?,
            per_doc
                .as_ref()
                .ok()
                .map(|p| estimate_s(p, ctx))
                .transpose()?,
        );
        // Ties keep per-sequence sharding (fewer, larger kernels).
        let doc_wins = match (t_seq, t_doc) {
            (Some(s), Some(d)) => d < s,
            (None, Some(_)) => true,
            _ => false,
        };
        let (refused, why) = match (&per_seq, &per_doc) {
            (Err(e), _) => ("llama3_refused", e.to_string()),
            (_, Err(e)) => ("per_doc_refused", e.to_string()),
            _ => ("", String::new()),
        };
        let (mut plan, chose) = if doc_wins {
            (per_doc?, "per-doc")
        } else {
            (per_seq?, "llama3")
        };
        plan.scheme.name = self.name().to_string();
        let p = &mut plan.scheme.params;
        p.insert("chose".into(), chose.into());
        for (key, t) in [("est_ns_llama3", t_seq), ("est_ns_per_doc", t_doc)] {
            if let Some(t) = t {
                p.insert(key.into(), ((t * 1e9).round() as u64).into());
            }
        }
        if !refused.is_empty() {
            p.insert(refused.into(), why.into());
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::testing::{assert_plans_verify, with_ctx};

    /// Regression (bug hunt): per-doc CP of many short documents on many ranks built tiles
    /// past the plan cap (it now refuses); wlb-llm takes llama3 then, saying why.
    #[test]
    fn regression_a_candidate_too_large_leaves_the_other() {
        let batch = Batch::new(0, vec![128; 100_000]);
        let plan = with_ctx(64, Mask::Causal, |ctx| WlbLlm.plan(&batch, ctx)).unwrap();
        let p = &plan.scheme.params;
        assert_eq!(p["chose"], "llama3");
        assert!(p.contains_key("est_ns_llama3") && !p.contains_key("est_ns_per_doc"));
        assert!(p["per_doc_refused"]
            .as_str()
            .unwrap()
            .contains("more than a plan may hold"));
    }

    #[test]
    fn wlb_plans_verify() {
        let batches: &[&[u64]] = &[&[1], &[3000], &[1, 3, 16, 31, 100, 257]];
        assert_plans_verify(&WlbLlm, &[1, 2, 4, 8, 16], batches);
    }

    #[test]
    fn chooses_the_cheaper_estimate() {
        // Short documents fill the first half of the packed sequence and one long causal
        // document the second: per-sequence chunks r and 2N−1−r give rank 0 the long
        // document's tail (its heaviest rows) and rank N−1 its head, per-document sharding
        // balances it.
        let mut lens = vec![128; 64];
        lens.push(8192);
        let skewed = Batch::new(0, lens);
        // Many equal short documents: per-sequence sharding is already balanced and keeps
        // documents whole, per-document sharding cuts each into 2N tiny pieces.
        let uniform = Batch::new(0, vec![512; 32]);
        for (batch, want) in [(skewed, "per-doc"), (uniform, "llama3")] {
            let plan = with_ctx(8, Mask::Causal, |ctx| WlbLlm.plan(&batch, ctx)).unwrap();
            let p = &plan.scheme.params;
            assert_eq!(p["chose"], want, "{p:?}");
            let (s, d) = (
                p["est_ns_llama3"].as_u64().unwrap(),
                p["est_ns_per_doc"].as_u64().unwrap(),
            );
            assert_eq!(want == "per-doc", d < s, "{p:?}");
            assert_eq!(plan.scheme.name, "wlb-llm");
        }
    }

    #[test]
    fn estimate_is_the_slowest_rank() {
        let batch = Batch::new(0, vec![4096]);
        let (plan, est) = with_ctx(1, Mask::Causal, |ctx| {
            let p = Llama3.plan(&batch, ctx).unwrap();
            let e = estimate_s(&p, ctx).unwrap();
            (p, e)
        });
        // One rank, no communication: the tiles of the 2 chunks against their prefixes.
        assert!(plan.transfers.is_empty());
        assert!(est > 0.0);
    }
}
