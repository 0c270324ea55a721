//! `llama3` and `llama3-contig`: all-gather context parallelism over the packed sequence.
//!
//! * `llama3` — Llama 3 CP (Llama Team, "The Llama 3 Herd of Models", §3.3.2; TransformerEngine
//!   `cp_comm_type="all_gather"`): the whole packed sequence (documents back to back) is cut into
//!   2N equal chunks regardless of document boundaries, rank `r` holds chunks `r` and
//!   `2N − 1 − r`, K/V are all-gathered and each rank attends only to the K/V its queries need
//!   under the document mask.
//! * `llama3-contig` — zhuzilin/ring-flash-attention `llama3_flash_attn_varlen_func`
//!   (`ring_flash_attn/llama3_flash_attn_varlen.py`): the packed buffer is split contiguously,
//!   total/N tokens per rank; K/V are all-gathered `heads_k_stride` KV heads at a time, the next
//!   slice's gather overlapping the current slice's compute, and each rank attends to
//!   `local_k_slice`, the part of the gathered K/V its queries need.
//!
//! See `docs/schemes/llama3.md` and `docs/schemes/llama3-contig.md`.

use std::collections::BTreeMap;

use crate::plan::{HeadRange, Plan, PlanBuilder, PlanError, TokenRange};
use crate::trace::Batch;

use super::shard::{
    all_gather_heads, check_gather_ranges, gather_attend, gqa_group, needed_kv, own_all,
    packed_ranges, pad_batch, split_even, zigzag_pieces, Padding,
};
use super::{PlanContext, Planner};

/// Llama 3 CP: 2N-chunk zigzag of the packed sequence, K/V all-gather.
#[derive(Debug, Clone, Copy, Default)]
pub struct Llama3;

impl Planner for Llama3 {
    fn name(&self) -> &'static str {
        "llama3"
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let n = ctx.ranks as usize;
        // Llama3 CP cuts the packed sequence into 2N equal chunks: it pads to a multiple of 2N.
        let (padded, pads) = pad_batch(batch, Padding::Total(2 * n as u64));
        let batch = &padded;
        let total = batch.tokens();
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        b.mark_padding(&pads);
        // The zigzag layout of the whole packed sequence, mapped back onto documents.
        let shards: Vec<Vec<TokenRange>> = zigzag_pieces(total, ctx.ranks)
            .into_iter()
            .enumerate()
            .map(|(r, pieces)| {
                let mine: Vec<TokenRange> = pieces
                    .iter()
                    .flat_map(|&(s, e)| packed_ranges(&batch.doc_lens, s, e))
                    .collect();
                own_all(&mut b, r as u32, &mine)
            })
            .collect();
        gather_attend(&mut b, &shards)?;
        Ok(b.finish())
    }
}

/// ring-flash-attention's llama3 varlen: contiguous total/N split, head-strided K/V all-gather.
#[derive(Debug, Clone, Copy)]
pub struct Llama3Contig {
    /// KV heads gathered (and computed) per pipeline stage; must divide the KV head count.
    pub heads_k_stride: u32,
}

impl Default for Llama3Contig {
    /// ring-flash-attention's tests and HF adapter examples gather one KV head at a time.
    fn default() -> Self {
        Llama3Contig { heads_k_stride: 1 }
    }
}

impl Planner for Llama3Contig {
    fn name(&self) -> &'static str {
        "llama3-contig"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        BTreeMap::from([("heads_k_stride".to_string(), self.heads_k_stride.into())])
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let hk = ctx.model.kv_heads;
        let group = gqa_group("llama3-contig", ctx.model)?;
        let stride = self.heads_k_stride;
        if stride == 0 || hk % stride != 0 {
            return Err(PlanError::Planning(format!(
                "llama3-contig needs heads_k_stride ({stride}) to divide kv_heads ({hk})"
            )));
        }
        let n = ctx.ranks;
        // An even contiguous split: the packed length is padded to a multiple of N.
        let (padded, pads) = pad_batch(batch, Padding::Total(n as u64));
        let batch = &padded;
        let total = batch.tokens();
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        b.mark_padding(&pads);
        let shards: Vec<Vec<TokenRange>> = split_even(total, n as u64)
            .into_iter()
            .enumerate()
            .map(|(r, (s, e))| own_all(&mut b, r as u32, &packed_ranges(&batch.doc_lens, s, e)))
            .collect();
        // Every stage gathers every shard to every other rank: refuse an oversized plan
        // before the first stage is built (at 4096 ranks the second stage's check used to
        // refuse it after 13 s and 3.4 GB spent building the first).
        let pieces: u64 = shards.iter().map(|s| s.len() as u64).sum();
        let stages = u64::from(hk / stride);
        check_gather_ranges(n as usize, stages, stages.saturating_mul(pieces))?;
        let mask = b.mask();
        let ranks: Vec<u32> = (0..n).collect();
        for stage in 0..hk / stride {
            let heads = HeadRange {
                start: stage * stride * group,
                end: (stage + 1) * stride * group,
            };
            for r in 0..n {
                for q in &shards[r as usize] {
                    for kv in needed_kv(mask, &batch.doc_lens, std::slice::from_ref(q)) {
                        b.task_heads(r, stage, *q, kv, Some(heads));
                    }
                }
            }
            // Slice `stage` is gathered while slice `stage − 1` computes (double buffer); the
            // first slice's gather is exposed.
            all_gather_heads(
                &mut b,
                &ranks,
                &shards,
                stage,
                stage.saturating_sub(1),
                stage,
                Some(heads),
            )?;
        }
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{summarize, Mask, TransferKind};
    use crate::planners::testing::{assert_plans_verify, with_ctx};

    #[test]
    fn llama3_plans_verify() {
        let batches: &[&[u64]] = &[&[1], &[5000], &[1, 2, 7, 33, 100, 5], &[3, 900, 17]];
        for planner in [&Llama3 as &dyn Planner, &Llama3Contig::default()] {
            assert_plans_verify(planner, &[1, 2, 3, 4, 8, 16], batches);
        }
    }

    #[test]
    fn llama3_cuts_the_packed_sequence_into_2n_chunks() {
        // 16 tokens, N = 2: chunks of 4 → rank 0 holds [0,4) and [12,16), rank 1 [4,12).
        let batch = Batch::new(0, vec![6, 10]);
        let plan = with_ctx(2, Mask::Causal, |ctx| Llama3.plan(&batch, ctx)).unwrap();
        let t = TokenRange::new;
        assert_eq!(plan.ranks[0].owned, vec![t(0, 0, 4), t(1, 6, 10)]);
        assert_eq!(plan.ranks[1].owned, vec![t(0, 4, 6), t(1, 0, 6)]);
        // Rank 0 step 1: doc 1 queries [6,10) see the gathered doc-1 prefix [0,6) only.
        let step1: Vec<_> = plan.ranks[0].steps[1]
            .tasks
            .iter()
            .map(|x| (x.q, x.kv))
            .collect();
        assert_eq!(step1, vec![(t(1, 6, 10), t(1, 0, 6))]);
        // Rank 1 needs nothing remote for doc 0 beyond [0,4), and nothing of doc 1.
        let step1: Vec<_> = plan.ranks[1].steps[1]
            .tasks
            .iter()
            .map(|x| (x.q, x.kv))
            .collect();
        assert_eq!(step1, vec![(t(0, 4, 6), t(0, 0, 4))]);
        assert!(plan
            .transfers
            .iter()
            .all(|x| x.kind == TransferKind::AllGather
                && x.collective == Some(0)
                && x.arrive_by == 1));
        assert_eq!(plan.scheme.params["pad_tokens"], 0);
    }

    /// Anchors §0: a KV all-gather receives (N−1)/N · 2 · S · h_kv · d · b per rank.
    #[test]
    fn all_gather_volume_matches_formula() {
        for n in [2u32, 4, 8, 16] {
            let batch = Batch::new(0, vec![4096, 1024, 2048, 1024]); // S = 8192, divisible by 2N
            let s_total = 8192u64;
            let (plan, model) = with_ctx(n, Mask::Causal, |ctx| {
                (Llama3.plan(&batch, ctx).unwrap(), ctx.model.clone())
            });
            let sum = summarize(&plan, &model);
            let (hkv, d, bytes) = (model.kv_heads as u64, model.head_dim as u64, 2u64);
            let want = (n as u64 - 1) * 2 * s_total * hkv * d * bytes / n as u64;
            for r in &sum.per_rank {
                assert_eq!(r.bytes_recv, want, "N={n} rank {}", r.rank);
                assert_eq!(r.bytes_sent, want, "N={n} rank {}", r.rank);
            }
            // The head-strided gather moves the same bytes in kv_heads slices.
            let plan = with_ctx(n, Mask::Causal, |ctx| {
                Llama3Contig::default().plan(&batch, ctx)
            });
            let sum = summarize(&plan.unwrap(), &model);
            for r in &sum.per_rank {
                assert_eq!(r.bytes_recv, want, "contig N={n} rank {}", r.rank);
            }
        }
    }

    #[test]
    fn contig_pipeline_overlaps_next_slice() {
        let batch = Batch::new(0, vec![100, 28]);
        let plan = with_ctx(4, Mask::Causal, |ctx| {
            Llama3Contig::default().plan(&batch, ctx)
        });
        let plan = plan.unwrap();
        // llama3-70b in tests: 8 KV heads → 8 stages, one per KV head (8 query heads each).
        assert_eq!(plan.ranks[0].steps.len(), 8);
        for t in &plan.transfers {
            let id = t.collective.unwrap();
            assert_eq!(t.arrive_by, id);
            assert_eq!(t.issue_at, id.saturating_sub(1));
            let h = t.heads.unwrap();
            assert_eq!((h.start, h.end), (8 * id, 8 * id + 8));
        }
        // Rank 0 owns [0,32) of doc 0: its causal K slice is the prefix [0,32).
        let t0 = plan.ranks[0].steps[0].tasks[0];
        assert_eq!(
            (t0.q, t0.kv),
            (TokenRange::new(0, 0, 32), TokenRange::new(0, 0, 32))
        );
    }

    #[test]
    fn contig_rejects_a_stride_that_does_not_divide_kv_heads() {
        let batch = Batch::new(0, vec![10]);
        let err = with_ctx(2, Mask::Causal, |ctx| {
            Llama3Contig { heads_k_stride: 3 }.plan(&batch, ctx)
        })
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("heads_k_stride (3) to divide kv_heads (8)"),
            "{err}"
        );
    }

    #[test]
    fn padding_is_recorded() {
        let batch = Batch::new(0, vec![7, 4]); // 11 tokens
        let plan = with_ctx(2, Mask::Causal, |ctx| Llama3.plan(&batch, ctx)).unwrap();
        assert_eq!(plan.scheme.params["pad_tokens"], 1); // → 12 = 3 · 4
        let plan = with_ctx(4, Mask::Causal, |ctx| {
            Llama3Contig::default().plan(&batch, ctx)
        });
        assert_eq!(plan.unwrap().scheme.params["pad_tokens"], 1);
    }
}
