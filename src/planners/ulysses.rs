//! `ulysses`: DeepSpeed Ulysses sequence parallelism (head-parallel attention).
//!
//! Source: Jacobs et al., "DeepSpeed Ulysses" (arXiv 2309.14509); deepspeed
//! `deepspeed/sequence/layer.py` (`DistributedAttention`, `_SeqAllToAll`); TransformerEngine
//! `cp_comm_type="a2a"`; feifeibear/long-context-attention (anchors-cp.md §0, §3, §4). Each rank
//! owns a contiguous 1/N of the packed sequence. An all-to-all turns sequence sharding into head
//! sharding: rank `r` receives, for every token, the Q of its head group `[r·H/N, (r+1)·H/N)` and
//! the K/V heads that group reads (replicated when N exceeds the KV head count); it runs plain
//! per-document attention for its heads; a second all-to-all returns the outputs to the owners.
//! Needs the query heads divisible by N. See `docs/schemes/ulysses.md`.

use crate::plan::{Plan, PlanBuilder, PlanError, TokenRange};
use crate::trace::Batch;

use super::shard::{
    check_head_all_to_alls, gqa_group, head_all_to_all, head_group, own_all, packed_ranges,
    pad_batch, split_even, Padding,
};
use super::{PlanContext, Planner};

/// Head-parallel attention behind two all-to-alls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ulysses;

impl Planner for Ulysses {
    fn name(&self) -> &'static str {
        "ulysses"
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let n = ctx.ranks;
        let hq = ctx.model.q_heads;
        if n == 0 || hq % n != 0 {
            return Err(PlanError::Planning(format!(
                "ulysses needs q_heads ({hq}) divisible by N ({n})"
            )));
        }
        let group = gqa_group("ulysses", ctx.model)?;
        // DeepSpeed splits the sequence dimension evenly: the packed length is padded to a
        // multiple of N.
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
        check_head_all_to_alls("ulysses", &shards, n)?;
        let members: Vec<u32> = (0..n).collect();
        // Outputs go back after step 0, the one step that computes.
        head_all_to_all(&mut b, &members, &shards, (hq, group), 0, 1);
        for r in 0..n {
            for (doc, &len) in batch.doc_lens.iter().enumerate() {
                let whole = TokenRange::new(doc as u32, 0, len);
                b.task_heads(r, 0, whole, whole, Some(head_group(hq, n, r)));
            }
        }
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;
    use crate::plan::{summarize, HeadRange, Mask, TransferTensor};
    use crate::planners::testing::{assert_plans_verify, assert_valid, with_ctx};

    #[test]
    fn ulysses_plans_verify() {
        let batches: &[&[u64]] = &[&[1], &[2000], &[1, 2, 7, 33, 100, 5]];
        assert_plans_verify(&Ulysses, &[1, 2, 4, 8, 16], batches);
    }

    #[test]
    fn indivisible_heads_are_refused_by_name() {
        let batch = Batch::new(0, vec![100]);
        let err = with_ctx(6, Mask::Causal, |ctx| Ulysses.plan(&batch, ctx)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ulysses needs q_heads (64) divisible by N (6)"
        );
    }

    /// Anchors §0: Ulysses moves (N−1)/N · s · d · b · (2h_q + 2h_kv) per rank per layer. The
    /// formula counts, per rank, the bytes received in the forward's four all-to-alls: Q
    /// (h_q), K and V (2h_kv) of the other ranks' tokens for its heads, and O (h_q) of its own
    /// tokens from the ranks that computed them (the same figure is sent). Our `out` pieces also
    /// carry the f32 log-sum-exp (4 bytes per head per token), which Ulysses does not need since
    /// each head's output is complete; the test states that excess explicitly.
    #[test]
    fn all_to_all_volume_matches_formula() {
        for n in [2u32, 4, 8] {
            let batch = Batch::new(0, vec![4096, 2048, 1024, 1024]); // S = 8192
            let (plan, m) = with_ctx(n, Mask::Causal, |ctx| {
                (Ulysses.plan(&batch, ctx).unwrap(), ctx.model.clone())
            });
            let s = 8192 / n as u64;
            let (hq, hkv, d, bytes) = (m.q_heads as u64, m.kv_heads as u64, m.head_dim as u64, 2);
            let formula = (n as u64 - 1) * s * d * bytes * (2 * hq + 2 * hkv) / n as u64;
            let lse = (n as u64 - 1) * s * 4 * hq / n as u64;
            for r in summarize(&plan, &m).per_rank {
                assert_eq!(r.bytes_recv, formula + lse, "N={n} rank {}", r.rank);
                assert_eq!(r.bytes_sent, formula + lse, "N={n} rank {}", r.rank);
            }
        }
    }

    /// N = 16 > 8 KV heads: every rank needs one whole KV head, so K/V bytes are
    /// (N−1) · s · 2 · d · b per rank, twice the formula's (N−1)/N · s · 2 · h_kv · d · b.
    #[test]
    fn replicated_kv_heads_are_counted() {
        let n = 16u64;
        let batch = Batch::new(0, vec![8192]);
        let (plan, m) = with_ctx(16, Mask::Causal, |ctx| {
            (Ulysses.plan(&batch, ctx).unwrap(), ctx.model.clone())
        });
        let s = 8192 / n;
        let kv: u64 = plan
            .transfers
            .iter()
            .filter(|t| t.dst == 0 && t.tensor == TransferTensor::Kv)
            .map(|t| {
                crate::plan::transfer_bytes(
                    t.tensor,
                    t.tokens(),
                    t.heads.map(|h| (h.start, h.end)),
                    &plan,
                    &m,
                )
            })
            .sum();
        assert_eq!(kv, (n - 1) * s * 2 * m.head_dim as u64 * 2);
        assert_eq!(
            kv,
            2 * (n - 1) * s * 2 * m.kv_heads as u64 * m.head_dim as u64 * 2 / n
        );
        // Rank 1 computes query heads [4, 8), which read KV head 0 = query heads [0, 8).
        let t = plan
            .transfers
            .iter()
            .find(|t| t.dst == 1 && t.tensor == TransferTensor::Kv);
        assert_eq!(t.unwrap().heads, Some(HeadRange { start: 0, end: 8 }));
    }

    #[test]
    fn a_head_group_straddling_kv_heads_takes_both() {
        // 24 query heads over 8 KV heads (groups of 3), N = 12: rank 1 computes query heads
        // [2, 4), which read KV heads 0 and 1, i.e. query heads [0, 6).
        let model = Model {
            name: "gqa24".into(),
            q_heads: 24,
            kv_heads: 8,
            head_dim: 4,
            dtype_bytes: 2,
            linear: None,
            tp: 1,
            stack: None,
        };
        let hw = crate::hardware::Hardware::load("h100").unwrap();
        let ctx = PlanContext {
            ranks: 12,
            tokens_per_rank: 64,
            mask: Mask::Causal,
            model: &model,
            hardware: &hw,
            judge: crate::planners::Judge::default(),
        };
        let plan = Ulysses.plan(&Batch::new(0, vec![30, 7]), &ctx).unwrap();
        assert_valid(&plan);
        let t = plan
            .transfers
            .iter()
            .find(|t| t.dst == 1 && t.tensor == TransferTensor::Kv);
        assert_eq!(t.unwrap().heads, Some(HeadRange { start: 0, end: 6 }));
    }
}
