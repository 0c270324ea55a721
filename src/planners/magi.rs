//! `magi`: MagiAttention's default dispatch and static KV-comm solver.
//!
//! Source: SandAI-org/MagiAttention (anchors-cp.md §1): `meta/solver/dispatch_solver.py`
//! (`MinHeapDispatchAlg`, the default), the static attn solver (KV-comm only: Q and O stay on
//! their host rank, each rank pulls the remote K/V its queries need with GroupCast), and
//! `meta/solver/overlap_solver.py` (`UniformOverlapAlg`, `OverlapConfig.degree`). The packed
//! sequence, padded to a multiple of `chunk · N`, is cut into chunks of `chunk` tokens; chunks
//! are dealt longest-area-first to the least-loaded rank that still has room, every rank getting
//! the same number of chunks; remote K/V are fetched in `degree` uniform stages, stage `i`
//! overlapping the compute of stage `i − 1` (the host stage first). See `docs/schemes/magi.md`.

use std::collections::BTreeMap;

use crate::plan::{
    allowed_pairs, Plan, PlanBuilder, PlanError, TokenRange, Transfer, TransferKind,
    TransferTensor, MAX_PAD_SLOTS,
};
use crate::trace::Batch;

use super::shard::{
    count_cross_tasks, cross_tasks, needed_kv, own_all, packed_ranges, subtract_ranges, Owners,
};
use super::{PlanContext, Planner, MAX_PLAN_ITEMS};

/// MagiAttention: min-heap chunk dispatch plus zero-redundancy K/V fetch.
#[derive(Debug, Clone, Copy)]
pub struct Magi {
    /// Query chunk size in tokens (`chunk_size`; the distributed benchmark uses 2048).
    pub chunk: u64,
    /// Remote overlap stages (`OverlapConfig.degree`, 1 by default).
    pub degree: u32,
}

impl Default for Magi {
    fn default() -> Self {
        Magi {
            chunk: 2048,
            degree: 1,
        }
    }
}

/// Assign `areas.len()` chunks to `n` buckets of exactly `areas.len() / n` chunks each by the
/// min-heap (LPT with a cardinality cap) rule: chunks in decreasing area (ties: lower index),
/// each to the least-loaded bucket that is not full (ties: lower rank). Returns each bucket's
/// chunk ids in increasing order.
pub(crate) fn min_heap_dispatch(areas: &[u128], n: usize) -> Vec<Vec<usize>> {
    let cap = areas.len() / n.max(1);
    let mut order: Vec<usize> = (0..areas.len()).collect();
    order.sort_by(|&a, &b| areas[b].cmp(&areas[a]).then(a.cmp(&b)));
    let mut load = vec![0u128; n];
    let mut buckets: Vec<Vec<usize>> = vec![Vec::new(); n];
    for c in order {
        let r = (0..n)
            .filter(|&r| buckets[r].len() < cap)
            .min_by_key(|&r| (load[r], r))
            .expect("cap · n = chunks leaves room");
        load[r] += areas[c];
        buckets[r].push(c);
    }
    for b in &mut buckets {
        b.sort_unstable();
    }
    buckets
}

/// Cut `ranges` (sorted) into `parts` consecutive groups of near-equal token counts, or into
/// one group per token when there are fewer tokens than `parts`: a stage past the last token
/// would be empty (bug hunt: `degree=4294967295` allocated a list per stage and aborted out of
/// memory; `10000000` took 18 s to plan one step). One pass over ranges and cuts together.
fn uniform_stages(ranges: &[TokenRange], parts: u32) -> Vec<Vec<TokenRange>> {
    let total: u64 = ranges.iter().map(TokenRange::len).sum();
    let parts = u64::from(parts).min(total).max(1);
    let cuts = super::shard::split_even(total, parts);
    let mut out = vec![Vec::new(); cuts.len()];
    let (mut offset, mut i) = (0u64, 0usize);
    for r in ranges {
        let end = offset + r.len();
        while let Some(&(a, z)) = cuts.get(i) {
            let (s, e) = (a.max(offset), z.min(end));
            if s < e {
                out[i].push(TokenRange::new(
                    r.doc,
                    r.start + s - offset,
                    r.start + e - offset,
                ));
            }
            if z > end {
                break; // the cut goes on into the next range
            }
            i += 1;
        }
        offset = end;
    }
    out
}

impl Planner for Magi {
    fn name(&self) -> &'static str {
        "magi"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        BTreeMap::from([
            ("chunk".to_string(), self.chunk.into()),
            ("degree".to_string(), self.degree.into()),
        ])
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        if self.chunk == 0 || self.degree == 0 {
            return Err(PlanError::Planning(
                "magi needs chunk ≥ 1 and degree ≥ 1".to_string(),
            ));
        }
        if ctx.ranks == 0 {
            return Err(PlanError::Planning("magi: the CP group has no rank".into()));
        }
        let n = ctx.ranks as u64;
        let total = batch.tokens();
        // MagiAttention pads the packed sequence to a multiple of chunk · cp_size; the padded
        // tail holds no attention but occupies chunk slots and memory. A chunk so large that
        // the padding passes what a plan may pad (or its product overflows) is refused: it
        // used to divide by a wrapped zero, or write a plan the verifier then refused (bug
        // hunt).
        let padded = self
            .chunk
            .checked_mul(n)
            .and_then(|span| total.div_ceil(span).max(1).checked_mul(span))
            .filter(|&padded| padded - total <= MAX_PAD_SLOTS)
            .ok_or_else(|| {
                PlanError::Planning(format!(
                    "magi: chunk={} for a CP group of {n} pads this batch of {total} tokens by more than \
                     the {MAX_PAD_SLOTS} slots a plan may pad; use a smaller chunk",
                    self.chunk
                ))
            })?;
        let num_chunks = padded / self.chunk;
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        let mask = b.mask();
        b.param("pad_tokens", (padded - total).into());
        let chunks: Vec<Vec<TokenRange>> = (0..num_chunks)
            .map(|k| {
                let (s, e) = (k * self.chunk, ((k + 1) * self.chunk).min(total));
                if s < e {
                    packed_ranges(&batch.doc_lens, s, e)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let areas: Vec<u128> = chunks
            .iter()
            .map(|pieces| {
                pieces
                    .iter()
                    .flat_map(|q| {
                        needed_kv(mask, &batch.doc_lens, std::slice::from_ref(q))
                            .into_iter()
                            .map(move |k| allowed_pairs(mask, q.start, q.end, k.start, k.end))
                    })
                    .sum()
            })
            .collect();
        let buckets = min_heap_dispatch(&areas, n as usize);
        let shards: Vec<Vec<TokenRange>> = buckets
            .iter()
            .enumerate()
            .map(|(r, ids)| {
                let mine: Vec<TokenRange> = ids.iter().flat_map(|&k| chunks[k].clone()).collect();
                // The padded part of each chunk is a buffer slot on this rank with no attention.
                let real: u64 = mine.iter().map(TokenRange::len).sum();
                b.pad_slots(r as u32, ids.len() as u64 * self.chunk - real);
                own_all(&mut b, r as u32, &mine)
            })
            .collect();
        // Each rank's remote K/V, in its overlap stages.
        let stages: Vec<Vec<Vec<TokenRange>>> = shards
            .iter()
            .map(|own| {
                let remote = subtract_ranges(&needed_kv(mask, &batch.doc_lens, own), own);
                uniform_stages(&remote, self.degree)
            })
            .collect();
        // Tiles grow with the square of the chunks a document is cut into: `chunk=1` on one
        // 16K-token document built 33 million tasks (3.4 GB) before anything refused it (bug
        // hunt). Count them first.
        let tiles: u64 = shards
            .iter()
            .zip(&stages)
            .map(|(own, kvs)| {
                count_cross_tasks(mask, own, own)
                    + kvs
                        .iter()
                        .map(|kv| count_cross_tasks(mask, own, kv))
                        .sum::<u64>()
            })
            .sum();
        if tiles > MAX_PLAN_ITEMS {
            return Err(PlanError::Planning(format!(
                "magi: chunk={} cuts this batch into {tiles} tiles (one task each), more than \
                 the {MAX_PLAN_ITEMS} a plan may hold; use a larger chunk",
                self.chunk
            )));
        }
        let owners = Owners::new(&shards);
        let mut transfers = Vec::new();
        for (r, (own, kvs)) in shards.iter().zip(stages).enumerate() {
            let r32 = r as u32;
            cross_tasks(&mut b, r32, 0, own, own);
            for (stage, kv) in kvs.into_iter().enumerate() {
                let stage = stage as u32;
                cross_tasks(&mut b, r32, stage + 1, own, &kv);
                // The remote K/V is, by construction, owned by other ranks only.
                for (src, ranges) in owners.split(&kv) {
                    transfers.push(Transfer {
                        kind: TransferKind::AllToAll,
                        collective: Some(stage),
                        tensor: TransferTensor::Kv,
                        src,
                        dst: r32,
                        also_to: Vec::new(),
                        ranges,
                        heads: None,
                        issue_at: stage,
                        arrive_by: stage + 1,
                        round: None,
                    });
                }
            }
        }
        for t in transfers {
            b.transfer(t);
        }
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::shard::intersect_ranges;
    use crate::planners::testing::{assert_plans_verify, assert_valid, with_ctx};

    /// `batch` planned by `magi:chunk=…,degree=…` on `n` ranks under `mask`.
    fn magi(chunk: u64, degree: u32, n: u32, mask: Mask, batch: &Batch) -> Result<Plan, PlanError> {
        with_ctx(n, mask, |ctx| Magi { chunk, degree }.plan(batch, ctx))
    }

    /// Regression (bug hunt): `chunk × N` wrapped to zero and panicked dividing by it, and a
    /// chunk past 2³² wrote a plan whose padding the verifier refused. Both are refused now,
    /// and the largest chunk that pads within the limit still plans a valid plan.
    #[test]
    fn a_chunk_too_large_to_pad_is_refused() {
        let batch = Batch::new(0, vec![100, 200, 3, 1, 7]);
        let plan = |chunk: u64| magi(chunk, 1, 2, Mask::Causal, &batch);
        for chunk in [1 << 63, (1 << 32) + 1, u64::MAX] {
            let err = plan(chunk).unwrap_err().to_string();
            assert!(
                err.contains("slots a plan may pad; use a smaller chunk"),
                "{chunk}: {err}"
            );
        }
        let largest = (MAX_PAD_SLOTS + 311) / 2;
        assert_valid(&plan(largest).unwrap());
    }

    /// Regression (bug hunt): `chunk=1` on one 16K-token document built 33.6 million tasks
    /// (3.4 GB) rather than refusing a plan past `MAX_PLAN_ITEMS`; it is counted first now.
    #[test]
    fn too_many_tiles_are_refused_before_they_are_built() {
        let batch = Batch::new(0, vec![16384]);
        let err = magi(1, 1, 2, Mask::Causal, &batch).unwrap_err().to_string();
        assert!(
            err.contains("magi: chunk=1 cuts this batch into 33566721 tiles"),
            "{err}"
        );
        // Just under the limit still plans (the count is the builder's: shard.rs proptest).
        let fits = Batch::new(0, vec![1024]);
        assert!(magi(1, 1, 2, Mask::Causal, &fits).is_ok());
    }

    /// Regression (bug hunt): a `degree` past the remote tokens allocated a stage list per unit
    /// of degree (4294967295 aborted out of memory). Stages past the last token are empty, so
    /// the plan is the one with a stage per remote token.
    #[test]
    fn regression_a_huge_degree_allocated_a_stage_per_unit() {
        let batch = Batch::new(0, vec![7, 1000, 2, 64]);
        let huge = magi(16, u32::MAX, 3, Mask::Causal, &batch).unwrap();
        assert_valid(&huge);
        let remote: u64 = huge
            .transfers
            .iter()
            .map(|t| t.ranges.iter().map(TokenRange::len).sum::<u64>())
            .sum();
        assert!(huge
            .ranks
            .iter()
            .all(|r| r.steps.len() as u64 <= 1 + remote));
        let mut per_token = magi(16, remote as u32, 3, Mask::Causal, &batch).unwrap();
        per_token.scheme.params = huge.scheme.params.clone();
        assert_eq!(per_token, huge);
    }

    /// The stages cover the remote ranges once, in order, near-equal, whatever the degree.
    #[test]
    fn uniform_stages_cut_in_order_into_near_equal_groups() {
        let ranges = [
            TokenRange::new(0, 0, 5),
            TokenRange::new(1, 3, 4),
            TokenRange::new(2, 10, 16),
        ];
        for parts in [1, 2, 3, 5, 12, 13, 1000] {
            let stages = uniform_stages(&ranges, parts);
            assert_eq!(stages.len() as u32, parts.min(12));
            let flat: Vec<(u32, u64)> = stages
                .iter()
                .flatten()
                .flat_map(|r| (r.start..r.end).map(move |t| (r.doc, t)))
                .collect();
            let want: Vec<(u32, u64)> = ranges
                .iter()
                .flat_map(|r| (r.start..r.end).map(move |t| (r.doc, t)))
                .collect();
            assert_eq!(flat, want, "{parts}");
            let sizes: Vec<u64> = stages
                .iter()
                .map(|s| s.iter().map(TokenRange::len).sum())
                .collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= 1, "{parts}: {sizes:?}");
        }
    }

    #[test]
    fn magi_plans_verify() {
        let batches: &[&[u64]] = &[&[1], &[2500], &[1, 2, 7, 33, 100, 5], &[3, 900, 17]];
        let small = Magi {
            chunk: 16,
            degree: 1,
        };
        let odd = Magi {
            chunk: 7,
            degree: 3,
        };
        for m in [Magi::default(), small, odd] {
            assert_plans_verify(&m, &[1, 2, 3, 4, 8, 16], batches);
        }
    }

    #[test]
    fn min_heap_is_lpt_with_equal_counts() {
        // Areas 9, 7, 6, 5, 4, 1 on 2 buckets of 3: 9→0, 7→1, 6→1 (7 < 9), 5→0 (9 < 13),
        // 4→1 (13 < 14); bucket 1 is full, so 1→0. Loads 15 and 17.
        let b = min_heap_dispatch(&[9, 7, 6, 5, 4, 1], 2);
        assert_eq!(b, vec![vec![0, 3, 5], vec![1, 2, 4]]);
    }

    #[test]
    fn equal_chunk_counts_and_padding() {
        // 40 tokens, chunk 8, N = 2: padded to 48 = 6 chunks, 3 per rank (one empty).
        let batch = Batch::new(0, vec![40]);
        let plan = magi(8, 1, 2, Mask::Causal, &batch).unwrap();
        assert_eq!(plan.scheme.params["pad_tokens"], 8);
        // Causal chunk areas 64k + 36 = 36, 100, 164, 228, 292, and 0 for the padding chunk:
        // chunk 4 (292)→0, 3 (228)→1, 2 (164)→1 (228 < 292), 1 (100)→0 (292 < 392), 0 (36)→0
        // (tie at 392, lower rank); rank 0 is full, so the padding chunk 5 goes to rank 1.
        let buckets = min_heap_dispatch(&[36, 100, 164, 228, 292, 0], 2);
        assert_eq!(buckets, vec![vec![0, 1, 4], vec![2, 3, 5]]);
        let t = TokenRange::new;
        assert_eq!(plan.ranks[0].owned, vec![t(0, 0, 16), t(0, 32, 40)]);
        assert_eq!(plan.ranks[1].owned, vec![t(0, 16, 32)]);
        let owned: Vec<u64> = plan
            .ranks
            .iter()
            .map(|r| r.owned.iter().map(TokenRange::len).sum())
            .collect();
        assert_eq!(owned.iter().sum::<u64>(), 40);
        // The empty padding chunk is rank 1's memory, not hidden.
        assert_eq!(plan.ranks[1].pad_slots, 8);
        assert_eq!(plan.pad_tokens(), 8);
        assert_valid(&plan);
    }

    /// MagiAttention sends no K/V range that no query on the receiver needs.
    #[test]
    fn sends_only_needed_kv() {
        for mask in [Mask::Causal, Mask::Full] {
            for degree in [1, 2, 4] {
                let batch = Batch::new(0, vec![300, 40, 7, 1000, 90]);
                let plan = magi(64, degree, 4, mask, &batch).unwrap();
                let lens: Vec<u64> = plan.documents.iter().map(|d| d.len).collect();
                for t in &plan.transfers {
                    let need = needed_kv(mask, &lens, &plan.ranks[t.dst as usize].owned);
                    let own = &plan.ranks[t.dst as usize].owned;
                    for r in &t.ranges {
                        assert_eq!(subtract_ranges(&[*r], &need), vec![], "{r:?} not needed");
                        assert_eq!(intersect_ranges(&[*r], own), vec![], "{r:?} already local");
                    }
                }
                // Every needed remote token arrives exactly once.
                for (r, rp) in plan.ranks.iter().enumerate() {
                    let want = subtract_ranges(&needed_kv(mask, &lens, &rp.owned), &rp.owned);
                    let got: Vec<TokenRange> = plan
                        .transfers
                        .iter()
                        .filter(|t| t.dst as usize == r)
                        .flat_map(|t| t.ranges.clone())
                        .collect();
                    let n_got: u64 = got.iter().map(TokenRange::len).sum();
                    let n_want: u64 = want.iter().map(TokenRange::len).sum();
                    assert_eq!(n_got, n_want);
                    assert_eq!(crate::planners::shard::merge_ranges(&got), want);
                }
            }
        }
    }

    #[test]
    fn stages_overlap_like_the_uniform_partition() {
        let batch = Batch::new(0, vec![4096]);
        let plan = magi(512, 2, 4, Mask::Full, &batch).unwrap();
        assert_eq!(plan.ranks[0].steps.len(), 3); // host + 2 remote stages
        for t in &plan.transfers {
            let s = t.collective.unwrap();
            assert_eq!((t.issue_at, t.arrive_by), (s, s + 1));
        }
        // Full mask: each rank fetches the 3072 tokens it does not own, 1536 per stage.
        for r in 0..4 {
            for s in 0..2 {
                let n: u64 = plan
                    .transfers
                    .iter()
                    .filter(|t| t.dst == r && t.collective == Some(s))
                    .map(Transfer::tokens)
                    .sum();
                assert_eq!(n, 1536);
            }
        }
    }
}
