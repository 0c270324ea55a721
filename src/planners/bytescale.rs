//! `bytescale`: ByteScale's data-aware sharding, as the FCP paper runs it as a baseline.
//!
//! Source: Ge et al., "ByteScale: Efficient Scaling of LLM Training with a 2048K Context Length
//! on More Than 12,000 GPUs" (arXiv 2502.21231; no public code, anchors-cp.md §4), as described
//! in the FCP paper (seed 000, §3.4 "Efficiency-optimized"): sequences are grouped by context
//! length and each group gets a number of ranks proportional to its length, with ring attention
//! inside each group. Short sequences stay whole on one rank; long ones span just enough ranks;
//! only ranks sharing a sequence communicate.
//!
//! Grouping rule (ours where the paper leaves it open; `docs/schemes/bytescale.md`):
//! * per-rank capacity `C = max(tokens_per_rank, ⌈S/N⌉)`; a document longer than `C` is *long*;
//! * every long document is its own group and needs `⌈L/C⌉` ranks; all short documents form one
//!   pool that needs one rank;
//! * if those minimums exceed N, the group losing least (smallest tokens per rank after the
//!   cut) gives one up, repeatedly; spare ranks go one at a time to the group with the most
//!   tokens per rank (proportional allocation, D'Hondt);
//! * groups take consecutive ranks, longest document first, the pool last; a long document is
//!   ring-attended inside its group (zigzag 2k-piece layout under a causal mask, contiguous k
//!   pieces under a full mask); short documents are dealt whole, longest first, to the pool rank
//!   holding the fewest tokens, and need no communication.

use crate::plan::{Mask, Plan, PlanBuilder, PlanError, TokenRange};
use crate::trace::Batch;

use super::shard::{contiguous_pieces, cross_tasks, ring_pass_group, zigzag_pieces};
use super::{PlanContext, Planner};

/// Length-grouped sharding with ring attention inside each long-document group.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteScale;

/// Ranks for groups of `tokens` with per-group minimums `min`, summing to `n` (see module docs).
pub(crate) fn apportion(tokens: &[u64], min: &[u32], n: u32) -> Vec<u32> {
    let mut k: Vec<u32> = min.iter().map(|&m| m.max(1)).collect();
    let per = |i: usize, k: u32| tokens[i] as f64 / k.max(1) as f64;
    while k.iter().sum::<u32>() > n {
        let i = (0..k.len())
            .filter(|&i| k[i] > 1)
            .min_by(|&a, &b| {
                per(a, k[a] - 1)
                    .total_cmp(&per(b, k[b] - 1))
                    .then(a.cmp(&b))
            })
            .expect("fewer groups than ranks");
        k[i] -= 1;
    }
    while k.iter().sum::<u32>() < n && !k.is_empty() {
        let i = (0..k.len())
            .max_by(|&a, &b| per(a, k[a]).total_cmp(&per(b, k[b])).then(b.cmp(&a)))
            .expect("non-empty");
        k[i] += 1;
    }
    k
}

/// Ranks for a ring of `k`, taken from `free`: inside one node where a node has `k` free
/// consecutive ranks (the lowest such), so its messages stay on NVLink; otherwise the lowest
/// `k` free consecutive ranks, or failing that the lowest `k` free ones. Rings come longest
/// first, so a ring that spans nodes starts where the ones before it ended, as in the
/// consecutive layout; a small ring no longer straddles a node's edge when another node has
/// room for it whole (bug hunt: a 3-rank ring ran across two 8-GPU nodes while the pool held a
/// node's last three ranks).
fn ring_ranks(free: &mut [bool], k: usize, gpn: usize) -> Vec<u32> {
    let run_at = |free: &[bool], s: usize| s + k <= free.len() && free[s..s + k].iter().all(|&f| f);
    let inside = (k <= gpn)
        .then(|| (0..free.len()).find(|&s| s / gpn == (s + k - 1) / gpn && run_at(free, s)))
        .flatten();
    let start = inside.or_else(|| (0..free.len()).find(|&s| run_at(free, s)));
    let ranks: Vec<usize> = match start {
        Some(s) => (s..s + k).collect(),
        None => (0..free.len()).filter(|&r| free[r]).take(k).collect(),
    };
    for &r in &ranks {
        free[r] = false;
    }
    ranks.into_iter().map(|r| r as u32).collect()
}

impl Planner for ByteScale {
    fn name(&self) -> &'static str {
        "bytescale"
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let n = ctx.ranks;
        let total = batch.tokens();
        let cap = ctx
            .tokens_per_rank
            .max(total.div_ceil(n.max(1) as u64))
            .max(1);
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        b.param("capacity", cap.into());
        let mut long: Vec<u32> = (0..batch.doc_lens.len() as u32)
            .filter(|&d| batch.doc_lens[d as usize] > cap)
            .collect();
        long.sort_by_key(|&d| (std::cmp::Reverse(batch.doc_lens[d as usize]), d));
        let mut short: Vec<u32> = (0..batch.doc_lens.len() as u32)
            .filter(|&d| batch.doc_lens[d as usize] <= cap)
            .collect();
        short.sort_by_key(|&d| (std::cmp::Reverse(batch.doc_lens[d as usize]), d));
        let mut tokens: Vec<u64> = long.iter().map(|&d| batch.doc_lens[d as usize]).collect();
        let mut min: Vec<u32> = tokens.iter().map(|&l| l.div_ceil(cap) as u32).collect();
        if !short.is_empty() {
            tokens.push(short.iter().map(|&d| batch.doc_lens[d as usize]).sum());
            min.push(1);
        }
        let sizes = apportion(&tokens, &min, n);
        b.param("groups", serde_json::json!(sizes));
        let mut shards: Vec<Vec<TokenRange>> = vec![Vec::new(); n as usize];
        let mut free = vec![true; n as usize];
        let gpn = ctx.hardware.gpus_per_node.max(1) as usize;
        for (i, &doc) in long.iter().enumerate() {
            let group = ring_ranks(&mut free, sizes[i] as usize, gpn);
            let k = sizes[i];
            let len = batch.doc_lens[doc as usize];
            let pieces: Vec<Vec<(u64, u64)>> = match ctx.mask {
                Mask::Causal => zigzag_pieces(len, k),
                Mask::Full => contiguous_pieces(len, k),
            };
            for (&r, mine) in group.iter().zip(pieces) {
                for (s, e) in mine {
                    let range = TokenRange::new(doc, s, e);
                    if !range.is_empty() {
                        b.own(r, range);
                        shards[r as usize].push(range);
                    }
                }
            }
            ring_pass_group(&mut b, &group, &shards)?;
        }
        if !short.is_empty() {
            // The pool never communicates: it takes whatever ranks the rings left.
            let pool: Vec<u32> = (0..n).filter(|&r| free[r as usize]).collect();
            let mut load = vec![0u64; pool.len()];
            for &doc in &short {
                let len = batch.doc_lens[doc as usize];
                let j = (0..pool.len()).min_by_key(|&j| (load[j], j)).expect("pool");
                load[j] += len;
                let range = TokenRange::new(doc, 0, len);
                b.own(pool[j], range);
                shards[pool[j] as usize].push(range);
            }
            for &r in &pool {
                let own = shards[r as usize].clone();
                cross_tasks(&mut b, r, 0, &own, &own);
            }
        }
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::summarize;
    use crate::planners::testing::{assert_plans_verify, assert_valid, with_ctx};
    use crate::planners::Zigzag;

    #[test]
    fn bytescale_plans_verify() {
        let batches: &[&[u64]] = &[
            &[1],
            &[5000],
            &[1, 2, 7, 33, 100, 5],
            &[3000, 1500, 17, 900, 2],
            &[1025, 1025, 1025],
        ];
        assert_plans_verify(&ByteScale, &[1, 2, 3, 4, 8, 16], batches);
    }

    /// Regression (bug hunt): rings took consecutive ranks in order, so on 8-GPU nodes a
    /// 3-rank ring ran across two nodes while the pool held ranks of a node it fitted in
    /// whole. A ring now takes a node's free run where one fits it whole.
    #[test]
    fn regression_a_ring_that_fits_a_node_stays_inside_one() {
        let mut free = vec![true; 12];
        let rings: Vec<Vec<u32>> = (0..3).map(|_| ring_ranks(&mut free, 3, 8)).collect();
        assert_eq!(rings, vec![vec![0, 1, 2], vec![3, 4, 5], vec![8, 9, 10]]);
        // A ring longer than a node takes the lowest free run, spanning nodes.
        let mut free = vec![true; 16];
        assert_eq!(ring_ranks(&mut free, 10, 8), (0..10).collect::<Vec<u32>>());
        assert_eq!(ring_ranks(&mut free, 4, 8), vec![10, 11, 12, 13]);
        // With no run left, the lowest free ranks.
        let mut free = vec![true, false, true, false, true];
        assert_eq!(ring_ranks(&mut free, 2, 8), vec![0, 2]);
        // End to end: every ring's messages stay inside a node of the H100 profile.
        let mut lens = vec![12000, 11900, 11800];
        lens.extend([1000; 12]);
        let plan = with_ctx(12, Mask::Causal, |ctx| {
            assert_eq!(ctx.hardware.gpus_per_node, 8);
            ByteScale.plan(&Batch::new(0, lens.clone()), ctx)
        })
        .unwrap();
        // Rings of 4, 3 and 3 and a pool of 2: consecutive, the second 3 ran on 7 to 9.
        assert_eq!(
            plan.scheme.params["groups"],
            serde_json::json!([4, 3, 3, 2])
        );
        assert!(plan.transfers.iter().all(|t| t.src / 8 == t.dst / 8));
        assert_valid(&plan);
    }

    #[test]
    fn groups_by_length_by_hand() {
        // N = 4, tokens_per_rank = 1024, S = 3172 → C = 1024. The 2048 document needs 2 ranks,
        // the short pool (1124 tokens) 1; the spare rank goes to the pool (1124 > 1024 per rank).
        let batch = Batch::new(0, vec![512, 2048, 100, 512]);
        let plan = with_ctx(4, Mask::Causal, |ctx| ByteScale.plan(&batch, ctx)).unwrap();
        assert_eq!(plan.scheme.params["groups"], serde_json::json!([2, 2]));
        let t = TokenRange::new;
        assert_eq!(plan.ranks[0].owned, vec![t(1, 0, 512), t(1, 1536, 2048)]);
        assert_eq!(plan.ranks[1].owned, vec![t(1, 512, 1024), t(1, 1024, 1536)]);
        assert_eq!(plan.ranks[2].owned, vec![t(0, 0, 512), t(2, 0, 100)]);
        assert_eq!(plan.ranks[3].owned, vec![t(3, 0, 512)]);
        // Only the long document's ring communicates.
        assert!(plan.transfers.iter().all(|x| x.src < 2 && x.dst < 2));
        assert_valid(&plan);
    }

    #[test]
    fn apportion_shrinks_and_spreads() {
        assert_eq!(apportion(&[4000, 100], &[4, 1], 4), vec![3, 1]);
        assert_eq!(apportion(&[3000, 3000, 10], &[3, 3, 1], 8), vec![4, 3, 1]);
        assert_eq!(apportion(&[10], &[1], 5), vec![5]);
    }

    /// Anchors §0: ring pass-KV moves (k−1) · 2 · s · h_kv · d · b per rank forward, here inside a
    /// ByteScale group of k ranks and over the whole group for zigzag.
    #[test]
    fn ring_volume_matches_formula() {
        let (hkv, d, bytes) = (8u64, 128u64, 2u64);
        let batch = Batch::new(0, vec![8192]);
        for n in [2u32, 4, 8] {
            let (plan, m) = with_ctx(n, Mask::Causal, |ctx| {
                (Zigzag.plan(&batch, ctx).unwrap(), ctx.model.clone())
            });
            let s = 8192 / n as u64;
            for r in summarize(&plan, &m).per_rank {
                assert_eq!(r.bytes_recv, (n as u64 - 1) * 2 * s * hkv * d * bytes);
            }
            let (plan, m) = with_ctx(n, Mask::Causal, |ctx| {
                (ByteScale.plan(&batch, ctx).unwrap(), ctx.model.clone())
            });
            for r in summarize(&plan, &m).per_rank {
                assert_eq!(
                    r.bytes_recv,
                    (n as u64 - 1) * 2 * s * hkv * d * bytes,
                    "bytescale N={n}"
                );
            }
        }
    }
}
