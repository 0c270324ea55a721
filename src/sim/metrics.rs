//! Metrics, named once (design.md) and used everywhere.

use serde::Serialize;

use crate::hardware::{Hardware, HardwareError};
use crate::model::Model;
use crate::plan::{imbalance, max_over_mean, Plan, TokenRange};

use super::compute::ComputeModel;
use super::engine::PassOutcome;
use super::index::PlanIndex;
use super::layer::{self, LayerCost, LayerMetrics, LayerPass};
use super::memory::peak_bytes;
use super::PassSel;

/// Per-rank results, summed over the simulated passes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankMetrics {
    /// Rank id.
    pub rank: u32,
    /// Time its compute stream ran kernels.
    pub compute_ms: f64,
    /// Time at least one of its messages or collectives was in flight.
    pub comm_ms: f64,
    /// Time its compute waited for data (communication not hidden behind compute).
    pub exposed_comm_ms: f64,
    /// The part of `exposed_comm_ms` during which none of its messages was moving: the data it
    /// waited for had not been sent yet, because the peer sending it was still computing. This
    /// is imbalance seen from the waiting rank, not a slow link ([`super::waits`]).
    pub waiting_on_peers_ms: f64,
    /// Time it had nothing to do while slower ranks finished.
    pub idle_ms: f64,
    /// FLOPs it computed.
    pub flops: f64,
    /// Bytes it sent.
    pub bytes_sent: u64,
    /// Bytes it received.
    pub bytes_recv: u64,
    /// Tokens it owns.
    pub tokens: u64,
    /// Peak attention memory: owned Q/K/V/O plus live receive (and gradient) buffers.
    pub mem_bytes: u64,
    /// Whole layer only ([`super::Simulator::with_layer`]): its token-linear work (projections
    /// and MLP), all passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linear_ms: Option<f64>,
    /// Whole layer only: when it finished the layer, summed over passes (under ZeRO 3, its
    /// wait for the layer's weight gathers included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_end_ms: Option<f64>,
    /// Whole layer only: the bytes one layer keeps on it for the backward pass
    /// ([`LayerCost::saved_bytes`]), held once per layer the GPU runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub act_bytes: Option<u64>,
    /// Whole layer under tensor parallelism only: its TP collectives (all-gathers and
    /// reduce-scatters of its tokens, [`crate::tp::stages`]) as far as they are exposed, all
    /// passes. They run on the compute stream beside the token-linear work and are not
    /// counted in `linear_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp_comm_ms: Option<f64>,
}

/// Plan-level results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanMetrics {
    /// Attention time: the slowest rank, summed over passes.
    pub attention_time_ms: f64,
    /// Largest per-rank peak memory.
    pub mem_max_bytes: u64,
    /// (max − mean) / max of per-rank compute time (FCP's definition).
    pub compute_imbalance: f64,
    /// (max − mean) / max of per-rank bytes sent + received.
    pub comm_imbalance: f64,
    /// max / mean of per-rank FLOPs (FlashCP's definition).
    pub max_over_mean: f64,
    /// Bytes moved, all ranks and passes.
    pub comm_bytes_total: u64,
    /// Model FLOPs / (attention time × ranks × dense peak).
    pub mfu: f64,
    /// Every document's attention as one whole kernel at its own profiled efficiency, spread
    /// evenly over the ranks, nothing exposed.
    pub lower_bound_ms: f64,
    /// attention_time_ms / lower_bound_ms.
    pub vs_lower_bound: f64,
    /// Mean over ranks of the compute time (all passes). Over `lower_bound_ms` it is what the
    /// plan's tiles cost in kernel efficiency, before any imbalance or waiting: `vs_lower_bound`
    /// = (mean_compute / bound) · (max_compute / mean_compute) · (time / max_compute).
    pub mean_compute_ms: f64,
    /// The busiest rank's compute time (all passes): over `mean_compute_ms`, the imbalance;
    /// `attention_time_ms` over it, the communication and waiting left exposed.
    pub max_compute_ms: f64,
    /// Padding tokens the scheme computes, stores and moves as if they were data (counted in
    /// every figure above but `mfu`, whose model FLOPs are the real documents'; the lower
    /// bound excludes them too).
    pub pad_tokens: u64,
    /// The whole layer, when simulated ([`super::Simulator::with_layer`]): its keys sit beside
    /// the attention metrics in JSON.
    #[serde(flatten)]
    pub layer: Option<LayerMetrics>,
}

/// The simulator's report for one plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// Scheme of the plan.
    pub scheme: String,
    /// Passes simulated: fwd, bwd or both.
    pub pass: String,
    /// Hardware profile.
    pub hardware: String,
    /// Model.
    pub model: String,
    /// CP group size.
    pub num_ranks: u32,
    /// Tensor-parallel degree the model is split by (`--tp`); absent when 1.
    #[serde(skip_serializing_if = "crate::tp::is_one")]
    pub tp: u32,
    /// Plan-level metrics.
    #[serde(flatten)]
    pub metrics: PlanMetrics,
    /// Per-rank rows.
    pub ranks: Vec<RankMetrics>,
}

const MS: f64 = 1e-6;

/// Lower bound in milliseconds: Σ over documents of the whole-document kernel time, ÷ N.
pub fn lower_bound_ms(
    plan: &Plan,
    cm: &mut ComputeModel<'_>,
    passes: PassSel,
) -> Result<f64, HardwareError> {
    let mut seconds = 0.0;
    for &pass in passes.passes() {
        for d in &plan.documents {
            seconds += cm.bound_document(plan.mask, d.len, pass)?.seconds;
        }
    }
    Ok(seconds * 1e3 / plan.num_ranks.max(1) as f64)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn report(
    plan: &Plan,
    idx: &PlanIndex,
    hw: &Hardware,
    model: &Model,
    passes: PassSel,
    outcomes: &[PassOutcome],
    lower_bound_ms: f64,
    // The layer cost, its passes, and the bound of what they ran besides the token-linear
    // GEMMs: attention's of every pass, and TP collectives on evenly spread tokens.
    layers: Option<(&LayerCost, &[LayerPass], f64)>,
) -> SimReport {
    let mem = peak_bytes(plan, idx, model, passes.passes());
    let attention_ns: u64 = outcomes.iter().map(|o| o.end_ns).sum();
    let tokens = plan.tokens_per_rank();
    let ranks: Vec<RankMetrics> = plan
        .ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let mut m = RankMetrics {
                rank: rp.rank,
                compute_ms: 0.0,
                comm_ms: 0.0,
                exposed_comm_ms: 0.0,
                waiting_on_peers_ms: 0.0,
                idle_ms: 0.0,
                flops: 0.0,
                bytes_sent: 0,
                bytes_recv: 0,
                tokens: rp.owned.iter().map(TokenRange::len).sum(),
                mem_bytes: mem[r],
                linear_ms: layers
                    .map(|(_, ps, _)| ps.iter().map(|p| p.linear_ns[r] as f64 * MS).sum()),
                layer_end_ms: layers
                    .map(|(_, ps, _)| ps.iter().map(|p| p.rank_end(r) as f64 * MS).sum()),
                act_bytes: layers.map(|(cost, _, _)| cost.saved_bytes(tokens[r])),
                tp_comm_ms: layers
                    .filter(|(cost, _, _)| cost.tp > 1)
                    .map(|(_, ps, _)| ps.iter().map(|p| p.tp_ns[r] as f64 * MS).sum()),
            };
            for o in outcomes {
                let x = &o.ranks[r];
                m.compute_ms += x.compute_ns as f64 * MS;
                m.comm_ms += x.comm_ns as f64 * MS;
                m.exposed_comm_ms += x.exposed_ns as f64 * MS;
                m.waiting_on_peers_ms += x.waiting_on_peers_ns as f64 * MS;
                m.idle_ms += (o.end_ns - x.finish_ns) as f64 * MS;
                m.flops += x.flops;
                m.bytes_sent += x.bytes_sent;
                m.bytes_recv += x.bytes_recv;
            }
            m
        })
        .collect();
    let compute: Vec<f64> = ranks.iter().map(|r| r.compute_ms).collect();
    let bytes: Vec<f64> = ranks
        .iter()
        .map(|r| (r.bytes_sent + r.bytes_recv) as f64)
        .collect();
    let flops: Vec<f64> = ranks.iter().map(|r| r.flops).collect();
    let total_flops: f64 = flops.iter().sum();
    let model_flops = model_attention_flops(plan, total_flops);
    let attention_time_ms = attention_ns as f64 * MS;
    let peak = hw.peak_tflops * 1e12;
    let mfu = if attention_ns == 0 {
        0.0
    } else {
        model_flops / (attention_ns as f64 * 1e-9 * plan.num_ranks as f64 * peak)
    };
    SimReport {
        scheme: plan.scheme.name.clone(),
        pass: passes.name().to_string(),
        hardware: hw.name.clone(),
        model: model.name.clone(),
        num_ranks: plan.num_ranks,
        tp: model.tp.max(1),
        metrics: PlanMetrics {
            attention_time_ms,
            mem_max_bytes: mem.iter().copied().max().unwrap_or(0),
            compute_imbalance: imbalance(&compute),
            comm_imbalance: imbalance(&bytes),
            max_over_mean: max_over_mean(&flops),
            comm_bytes_total: ranks.iter().map(|r| r.bytes_sent).sum(),
            mfu,
            lower_bound_ms,
            vs_lower_bound: if lower_bound_ms > 0.0 {
                attention_time_ms / lower_bound_ms
            } else {
                1.0
            },
            pad_tokens: plan.pad_tokens(),
            mean_compute_ms: compute.iter().sum::<f64>() / compute.len().max(1) as f64,
            max_compute_ms: compute.iter().copied().fold(0.0, f64::max),
            layer: layers.map(|(cost, ps, layer_fixed_bound_ms)| {
                let docs: Vec<u64> = plan.documents.iter().map(|d| d.len).collect();
                layer::metrics(
                    cost,
                    ps,
                    &tokens,
                    &docs,
                    model_flops,
                    layer_fixed_bound_ms,
                    peak,
                )
            }),
        },
        ranks,
    }
}

/// The model's attention FLOPs among the `executed` ones: the real documents' pairs, not
/// their padding's. The verifier's exact cover computes every allowed pair of each covered
/// extent (document plus padding) once, at the same FLOPs per pair, so the FLOPs run scale by
/// real pairs over covered pairs. (Bug hunt: Ulysses padding a 17-token document to 32 read
/// 3.45× its MFU, against the docs' "model FLOPs".)
fn model_attention_flops(plan: &Plan, executed: f64) -> f64 {
    let pairs = |len: fn(&crate::plan::Document) -> u64| -> f64 {
        plan.documents
            .iter()
            .map(|d| crate::plan::allowed_pairs(plan.mask, 0, len(d), 0, len(d)) as f64)
            .sum()
    };
    let covered = pairs(crate::plan::Document::extent);
    if covered > 0.0 {
        executed * pairs(|d| d.len) / covered
    } else {
        0.0
    }
}
