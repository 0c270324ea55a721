//! Peak attention memory per rank, so users can plan against OOM: owned Q, K, V and O, plus the
//! receive buffers live at the worst step (and, for backward, the gradient buffers).

use crate::hardware::Pass;
use crate::model::Model;
use crate::plan::{Plan, TokenRange, TransferTensor};

use super::index::PlanIndex;
use super::program::{bytes_each, grad_bytes};

/// Peak bytes on each rank over the given passes.
pub fn peak_bytes(plan: &Plan, idx: &PlanIndex, model: &Model, passes: &[Pass]) -> Vec<u64> {
    let dtype = model.dtype_bytes.max(1) as u64;
    let gb = grad_bytes(plan, model);
    let n = plan.ranks.len();
    let nsteps = plan.ranks.iter().map(|r| r.steps.len()).max().unwrap_or(0) + 1;
    // Live received bytes per rank per step.
    let mut live = vec![vec![0u64; nsteps]; n];
    let bytes = bytes_each(plan, model);
    for (d, dl) in plan.deliveries().enumerate() {
        let t = dl.transfer;
        // Outputs land in their owner's O buffer; reshuffled Q/K/V (a plan with an input
        // layout) lands in the receiver's own buffers, counted with its owned tokens.
        if t.tensor == TransferTensor::Out || idx.owns_all(dl.dst, &t.ranges) {
            continue;
        }
        let bytes = bytes[dl.index];
        let from = t.arrive_by.saturating_sub(1) as usize;
        let until = idx
            .use_steps(d)
            .map_or(t.arrive_by, |(_, last)| last.max(t.arrive_by)) as usize;
        // A plan may name a step past the last one; clamp, and never build a reversed range.
        let until = until.min(nsteps - 1);
        let from = from.min(until);
        for slot in &mut live[dl.dst as usize][from..=until] {
            *slot = slot.saturating_add(bytes);
        }
    }
    plan.ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            // Masked padding slots occupy Q/K/V/O buffers like owned tokens.
            // Saturating: a hand-made plan's padding of 2⁶⁰ slots reads as "more than any
            // GPU has", never as a small number that wrapped around.
            let tokens: u64 = rp
                .owned
                .iter()
                .map(TokenRange::len)
                .fold(rp.pad_slots, u64::saturating_add);
            let q = model.q_bytes_per_token();
            let kv = model.kv_bytes_per_token();
            let recv = live[r].iter().copied().max().unwrap_or(0);
            let fwd = tokens.saturating_mul(2 * q + kv).saturating_add(recv);
            passes
                .iter()
                .map(|p| match p {
                    Pass::Fwd => fwd,
                    // dQ, dK, dV for owned tokens and a gradient buffer per received buffer.
                    Pass::Bwd => fwd.saturating_add(
                        (tokens.saturating_mul(q + kv).saturating_add(recv) / dtype)
                            .saturating_mul(gb),
                    ),
                })
                .max()
                .unwrap_or(fwd)
        })
        .collect()
}
