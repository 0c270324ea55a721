//! `ring`: ring attention over packed variable-length documents.
//!
//! Source: zhuzilin/ring-flash-attention `ring_flash_attn_varlen` — every document is cut into N
//! contiguous pieces, piece `r` of every document lives on rank `r`, and K/V circulate around
//! the ring in N − 1 steps. With a causal mask rank `r` has useful work only in steps `0..=r`,
//! the imbalance zigzag fixes. See `docs/schemes/ring.md`.

use crate::plan::{Plan, PlanBuilder, PlanError};
use crate::trace::Batch;

use std::collections::BTreeMap;

use super::shard::{
    assign_pieces, check_ring_bound, contiguous_pieces, ring_flash_params, ring_pass,
};
use super::{PlanContext, Planner};

/// Contiguous per-document ring attention.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ring;

impl Planner for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        ring_flash_params()
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let n = ctx.ranks;
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        check_ring_bound(&b, batch, n)?;
        let shards = assign_pieces(&mut b, batch, n, |len| contiguous_pieces(len, n));
        ring_pass(&mut b, &shards)?;
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::testing::{assert_plans_verify, with_ctx};

    #[test]
    fn ring_plans_verify_structurally_and_numerically() {
        assert_plans_verify(&Ring, &[1, 2, 3, 4, 8], &[&[1, 2, 7, 33, 100, 5]]);
    }

    #[test]
    fn causal_ring_loads_late_ranks_more() {
        let batch = Batch::new(0, vec![4096]);
        let plan = with_ctx(4, Mask::Causal, |ctx| Ring.plan(&batch, ctx)).unwrap();
        let tasks: Vec<usize> = plan
            .ranks
            .iter()
            .map(|r| r.steps.iter().map(|s| s.tasks.len()).sum())
            .collect();
        assert_eq!(tasks, vec![1, 2, 3, 4]);
        // Full KV travels N − 1 hops for every rank.
        assert_eq!(plan.transfers.len(), 4 * 3);
    }
}
