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
        // Live from the step the transfer is issued: its data may land any time after (bug
        // hunt: a buffer issued several steps early was counted from the step before its
        // data was due only; one issued at the step that reads it, from the step before).
        let from = t.issue_at.min(t.arrive_by) as usize;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::testing::with_ctx;
    use crate::planners::{Llama3Contig, Planner};
    use crate::trace::Batch;

    /// Regression (bug hunt): Llama3-contig all-gathers K/V one slice of heads per step, each
    /// issued the step before it is read; every slice was held to the last step (the reads
    /// were matched by tokens only), so the peak counted all eight slices, not two.
    #[test]
    fn regression_head_slices_are_double_buffered() {
        let model = Model::load("llama3-70b").unwrap();
        let plan = with_ctx(2, Mask::Full, |ctx| {
            Llama3Contig::default().plan(&Batch::new(0, vec![32000]), ctx)
        })
        .unwrap();
        assert_eq!(plan.ranks[0].steps.len(), 8, "one step per K/V head");
        let idx = PlanIndex::new(&plan);
        let fwd = peak_bytes(&plan, &idx, &model, &[Pass::Fwd])[0];
        let owned = 16000 * (2 * model.q_bytes_per_token() + model.kv_bytes_per_token());
        let slice = 16000 * model.kv_bytes_per_token() / 8;
        assert_eq!(fwd, owned + 2 * slice);
    }

    /// Regression (bug hunt): a receive buffer was counted from the step before its data was
    /// due, whatever step its transfer was issued at; one issued three steps early holds its
    /// buffer through them, beside the ring's double buffer.
    #[test]
    fn regression_a_buffer_is_live_from_its_issue() {
        let model = Model::load("llama3-70b").unwrap();
        let mut plan = with_ctx(4, Mask::Causal, |ctx| {
            crate::planners::Ring.plan(&Batch::new(0, vec![4096]), ctx)
        })
        .unwrap();
        let peak = |plan: &Plan| peak_bytes(plan, &PlanIndex::new(plan), &model, &[Pass::Fwd])[0];
        let before = peak(&plan);
        let last = plan
            .transfers
            .iter_mut()
            .find(|t| t.dst == 0 && t.arrive_by == 3)
            .expect("rank 0 receives K/V for its last step");
        last.issue_at = 0;
        let buffer = 1024 * model.kv_bytes_per_token();
        assert_eq!(peak(&plan), before + buffer, "three buffers live at step 1");
    }
}
