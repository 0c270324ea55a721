//! Static facts about a plan that need no simulation: per-rank tokens, attention pairs (FLOPs
//! up to a constant) and bytes moved. The simulator turns these into time; these alone already
//! show the imbalance a scheme builds in.

use serde::Serialize;

use super::{allowed_pairs, Plan, TokenRange, TransferTensor};
use crate::model::Model;

/// Per-rank static load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankLoad {
    /// Rank id.
    pub rank: u32,
    /// Tokens owned.
    pub tokens: u64,
    /// Mask-allowed (q, k) pairs computed, summed over tasks (per query head).
    pub pairs: u128,
    /// Forward attention FLOPs: 4 · pairs · d · h_q (heads restricted by head ranges).
    pub flops: f64,
    /// Bytes this rank sends.
    pub bytes_sent: u64,
    /// Bytes this rank receives.
    pub bytes_recv: u64,
    /// Tasks run.
    pub tasks: usize,
}

/// Static summary of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanSummary {
    /// Scheme name.
    pub scheme: String,
    /// CP group size.
    pub ranks: u32,
    /// Documents in the batch.
    pub docs: usize,
    /// Tokens in the batch.
    pub tokens: u64,
    /// Compute steps.
    pub steps: usize,
    /// Tasks over all ranks.
    pub tasks: usize,
    /// Transfers over all ranks.
    pub transfers: usize,
    /// Bytes moved over all transfers.
    pub comm_bytes_total: u64,
    /// Max over mean of per-rank forward FLOPs (FlashCP's balance metric; 1.0 is perfect).
    pub max_over_mean: f64,
    /// (max − mean) / max of per-rank forward FLOPs (FCP's imbalance ratio; 0 is perfect).
    pub flops_imbalance: f64,
    /// (max − mean) / max of per-rank bytes sent + received.
    pub comm_imbalance: f64,
    /// Per-rank rows.
    pub per_rank: Vec<RankLoad>,
}

/// Bytes one transfer moves for `model`: K and V for `kv`, Q for `q`, O (plus the f32
/// log-sum-exp per head) for `out`, scaled by the share of heads it carries.
pub fn transfer_bytes(
    tensor: TransferTensor,
    tokens: u64,
    heads: Option<(u32, u32)>,
    plan: &Plan,
    model: &Model,
) -> u64 {
    let per_token = match tensor {
        TransferTensor::Kv => model.kv_bytes_per_token(),
        TransferTensor::Q => model.q_bytes_per_token(),
        TransferTensor::Out => model.q_bytes_per_token() + 4 * model.q_heads as u64,
    };
    let bytes = tokens * per_token;
    match heads {
        None => bytes,
        Some((a, b)) => bytes * (b - a) as u64 / plan.q_heads.max(1) as u64,
    }
}

/// (max − mean) / max; 0 for an all-zero load.
pub fn imbalance(values: &[f64]) -> f64 {
    let max = values.iter().cloned().fold(0.0, f64::max);
    if max <= 0.0 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    // Rounding can put the mean a hair above an equal max; imbalance is never negative.
    ((max - mean) / max).max(0.0)
}

/// max / mean; 1 for an all-zero load.
pub fn max_over_mean(values: &[f64]) -> f64 {
    let max = values.iter().cloned().fold(0.0, f64::max);
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    if mean <= 0.0 {
        1.0
    } else {
        max / mean
    }
}

/// Summarise `plan` for `model`.
pub fn summarize(plan: &Plan, model: &Model) -> PlanSummary {
    let head_frac = |h: Option<super::HeadRange>| match h {
        None => 1.0,
        Some(h) => (h.end - h.start) as f64 / plan.q_heads.max(1) as f64,
    };
    let mut per_rank: Vec<RankLoad> = plan
        .ranks
        .iter()
        .map(|rp| {
            let mut pairs = 0u128;
            let mut flops = 0.0;
            let mut tasks = 0;
            for t in rp.steps.iter().flat_map(|s| &s.tasks) {
                let p = allowed_pairs(plan.mask, t.q.start, t.q.end, t.kv.start, t.kv.end);
                pairs += p;
                flops += 4.0
                    * p as f64
                    * model.head_dim as f64
                    * model.q_heads as f64
                    * head_frac(t.heads);
                tasks += 1;
            }
            RankLoad {
                rank: rp.rank,
                tokens: rp.owned.iter().map(TokenRange::len).sum(),
                pairs,
                flops,
                bytes_sent: 0,
                bytes_recv: 0,
                tasks,
            }
        })
        .collect();
    let mut total = 0u64;
    for t in &plan.transfers {
        let b = transfer_bytes(
            t.tensor,
            t.tokens(),
            t.heads.map(|h| (h.start, h.end)),
            plan,
            model,
        );
        let receivers = t.receiver_count() as u64;
        total += b * receivers;
        per_rank[t.src as usize].bytes_sent += b * receivers;
        for dst in t.receivers() {
            per_rank[dst as usize].bytes_recv += b;
        }
    }
    let flops: Vec<f64> = per_rank.iter().map(|r| r.flops).collect();
    let bytes: Vec<f64> = per_rank
        .iter()
        .map(|r| (r.bytes_sent + r.bytes_recv) as f64)
        .collect();
    PlanSummary {
        scheme: plan.scheme.name.clone(),
        ranks: plan.num_ranks,
        docs: plan.documents.len(),
        tokens: plan.total_tokens(),
        steps: plan.ranks.iter().map(|r| r.steps.len()).max().unwrap_or(0),
        tasks: plan.num_tasks(),
        transfers: plan.transfers.len(),
        comm_bytes_total: total,
        max_over_mean: max_over_mean(&flops),
        flops_imbalance: imbalance(&flops),
        comm_imbalance: imbalance(&bytes),
        per_rank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imbalance_definitions() {
        assert_eq!(imbalance(&[1.0, 1.0]), 0.0);
        assert!((imbalance(&[1.0, 3.0]) - (3.0 - 2.0) / 3.0).abs() < 1e-12);
        assert!((max_over_mean(&[1.0, 3.0]) - 1.5).abs() < 1e-12);
        assert_eq!(imbalance(&[0.0, 0.0]), 0.0);
        assert_eq!(max_over_mean(&[0.0]), 1.0);
    }
}
