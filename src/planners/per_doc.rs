//! `per-doc`: WLB-LLM's per-document context parallelism.
//!
//! Source: Wang et al., "WLB-LLM: Workload-Balance 4D Parallelism for LLM Training" (OSDI'25,
//! arXiv 2503.17924), per-document CP sharding; re-implemented by hao-ai-lab/DistCA
//! `baseline/wlbllm_original/wlbllm/per_doc_cp_attn.py` (anchors-cp.md §4). Every document is cut
//! into 2N chunks and rank `r` holds chunks `r` and `2N − 1 − r` of every document, so each
//! document's causal work is balanced on its own; K/V are all-gathered (the backward pass
//! reduce-scatters dK/dV, derived by the simulator). See `docs/schemes/per-doc.md`.

use crate::plan::{Plan, PlanBuilder, PlanError};
use crate::trace::Batch;

use super::shard::{
    assign_pieces, check_gather_ranges, gather_attend, pad_batch, zigzag_pieces, Padding,
};
use super::{PlanContext, Planner};

/// Per-document 2N-chunk sharding with a K/V all-gather.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerDoc;

impl Planner for PerDoc {
    fn name(&self) -> &'static str {
        "per-doc"
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let n = ctx.ranks as usize;
        // Padding makes every piece non-empty, so each rank holds at least one range of every
        // document and the all-gather lists at least docs × N ranges, delivered N − 1 times
        // each: refuse before cutting anything when even that is too many (16K ranks used to
        // take 6 GB to find out).
        let at_least = (batch.doc_lens.len() as u64).saturating_mul(n as u64);
        check_gather_ranges(n, 1, at_least)?;
        // Implementations that need every document divisible by 2N (TransformerEngine THD,
        // torch `_PerDocumentHeadTailLoadBalancer`) pad each one: planned and charged here.
        let (padded, pads) = pad_batch(batch, Padding::PerDocument(2 * n as u64));
        let batch = &padded;
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        b.mark_padding(&pads);
        let shards = assign_pieces(&mut b, batch, ctx.ranks, |len| {
            zigzag_pieces(len, ctx.ranks)
        });
        gather_attend(&mut b, &shards)?;
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{allowed_pairs, summarize, Mask, TokenRange};
    use crate::planners::testing::{assert_plans_verify, assert_valid, with_ctx};

    #[test]
    fn per_doc_plans_verify() {
        let batches: &[&[u64]] = &[&[1], &[3000], &[1, 3, 16, 31, 100, 257]];
        assert_plans_verify(&PerDoc, &[1, 2, 3, 4, 8, 16], batches);
    }

    /// Regression: per-doc CP refused 256 ranks on the bundled trace (1,995 documents) because
    /// its all-gather listed every rank's shard once per receiver, N(N − 1) pieces, past the
    /// plan-size limit. 600 one-token documents were already too many (600 · 256 · 255 >
    /// 2²⁵ ranges); each shard is now listed once, to its 255 receivers.
    #[test]
    fn per_doc_at_256_ranks_lists_each_shard_once() {
        let batch = Batch::new(0, vec![1; 600]);
        let plan = with_ctx(256, Mask::Causal, |ctx| PerDoc.plan(&batch, ctx)).unwrap();
        assert_eq!(plan.transfers.len(), 256);
        assert_eq!(plan.delivery_count(), 256 * 255);
        // Two zigzag pieces of every document per rank (one range where they meet).
        assert!(plan
            .transfers
            .iter()
            .all(|t| (600..=1200).contains(&t.ranges.len())));
        assert_eq!(plan.version, 2);
    }

    #[test]
    fn every_document_is_balanced_on_its_own() {
        let batch = Batch::new(0, vec![8 * 64, 8 * 16]);
        let plan = with_ctx(4, Mask::Causal, |ctx| PerDoc.plan(&batch, ctx)).unwrap();
        let t = TokenRange::new;
        assert_eq!(
            plan.ranks[1].owned,
            vec![t(0, 64, 128), t(0, 384, 448), t(1, 16, 32), t(1, 96, 112)]
        );
        for doc in 0..2 {
            let pairs: Vec<u128> = plan
                .ranks
                .iter()
                .map(|r| {
                    r.steps
                        .iter()
                        .flat_map(|s| &s.tasks)
                        .filter(|x| x.q.doc == doc)
                        .map(|x| {
                            allowed_pairs(Mask::Causal, x.q.start, x.q.end, x.kv.start, x.kv.end)
                        })
                        .sum()
                })
                .collect();
            assert!(pairs.iter().all(|&p| p == pairs[0]), "doc {doc}: {pairs:?}");
        }
        assert_eq!(plan.scheme.params["pad_tokens"], 0);
    }

    #[test]
    fn gathers_everything_and_pads_per_document() {
        let batch = Batch::new(0, vec![5, 9]);
        let (plan, model) = with_ctx(2, Mask::Causal, |ctx| {
            (PerDoc.plan(&batch, ctx).unwrap(), ctx.model.clone())
        });
        // 5 → 8 and 9 → 12 under 2N = 4.
        assert_eq!(plan.scheme.params["pad_tokens"], 3 + 3);
        let sum = summarize(&plan, &model);
        let own0: u64 = plan.ranks[0].owned.iter().map(TokenRange::len).sum();
        assert_eq!(
            sum.per_rank[1].bytes_recv,
            own0 * model.kv_bytes_per_token()
        );
    }

    #[test]
    fn padding_is_planned_and_charged_not_hidden() {
        // 10 tokens on 2 ranks: TransformerEngine pads to 12 (a multiple of 2N = 4).
        let batch = Batch::new(0, vec![10]);
        let plan = with_ctx(2, Mask::Causal, |ctx| PerDoc.plan(&batch, ctx)).unwrap();
        assert_eq!(plan.documents[0].len, 10);
        assert_eq!(plan.documents[0].pad, 2);
        assert_valid(&plan);
        let owned: u64 = plan
            .ranks
            .iter()
            .flat_map(|r| &r.owned)
            .map(TokenRange::len)
            .sum();
        assert_eq!(owned, 12, "padding occupies memory");
        let pairs: u128 = plan
            .ranks
            .iter()
            .flat_map(|r| &r.steps)
            .flat_map(|s| &s.tasks)
            .map(|t| allowed_pairs(Mask::Causal, t.q.start, t.q.end, t.kv.start, t.kv.end))
            .sum();
        assert_eq!(pairs, 12 * 13 / 2, "padding is computed");
        let sim = crate::sim::Simulator::new(
            crate::hardware::Hardware::load("h100").unwrap(),
            crate::Model::load("llama3-70b").unwrap(),
        )
        .unwrap();
        let r = sim.simulate(&plan, crate::sim::PassSel::Fwd).unwrap();
        assert_eq!(r.metrics.pad_tokens, 2);
    }
}
