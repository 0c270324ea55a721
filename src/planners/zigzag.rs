//! `zigzag`: zigzag ring attention over packed variable-length documents.
//!
//! Source: zhuzilin/ring-flash-attention `zigzag_ring_flash_attn_varlen` (and Megatron/TE's
//! load-balanced CP): every document is cut into 2N pieces and rank `r` holds pieces `r` and
//! `2N − 1 − r`, so under a causal mask each rank gets one early and one late piece and the same
//! work; K/V circulate around the ring in N − 1 steps. See `docs/schemes/zigzag.md`.

use crate::plan::{Plan, PlanBuilder, PlanError};
use crate::trace::Batch;

use std::collections::BTreeMap;

use super::shard::{assign_pieces, check_ring_bound, ring_flash_params, ring_pass, zigzag_pieces};
use super::{PlanContext, Planner};

/// Zigzag (2N-piece, mirrored) ring attention.
#[derive(Debug, Clone, Copy, Default)]
pub struct Zigzag;

impl Planner for Zigzag {
    fn name(&self) -> &'static str {
        "zigzag"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        ring_flash_params()
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        check_ring_bound(&b, batch, ctx.ranks)?;
        let shards = assign_pieces(&mut b, batch, ctx.ranks, |len| {
            zigzag_pieces(len, ctx.ranks)
        });
        ring_pass(&mut b, &shards)?;
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{allowed_pairs, Mask};
    use crate::planners::testing::{assert_plans_verify, with_ctx};

    #[test]
    fn zigzag_plans_verify_structurally_and_numerically() {
        assert_plans_verify(&Zigzag, &[1, 2, 3, 4, 8, 16], &[&[1, 3, 16, 31, 100, 257]]);
    }

    #[test]
    fn zigzag_balances_causal_pairs_exactly_when_divisible() {
        let batch = Batch::new(0, vec![8 * 512, 8 * 64]);
        let plan = with_ctx(4, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap();
        let pairs: Vec<u128> = plan
            .ranks
            .iter()
            .map(|r| {
                r.steps
                    .iter()
                    .flat_map(|s| &s.tasks)
                    .map(|t| allowed_pairs(Mask::Causal, t.q.start, t.q.end, t.kv.start, t.kv.end))
                    .sum()
            })
            .collect();
        assert!(pairs.iter().all(|&p| p == pairs[0]), "{pairs:?}");
    }
}
