//! Compute model: the time of one step (one kernel launch) on one rank.
//!
//! Each task is a (q × kv) tile of one document. Its time is its FLOPs divided by the
//! throughput the kernel profile reports for a tile of that shape (interpolated in
//! log-length), scaled down by the SMs reserved for communication. A step is one launch
//! ([`ComputeModel::launch`]) plus one launch overhead: the unmasked tiles of one query range
//! (same heads) in a step are one fused tile — the executor concatenates those keys, every one
//! of which the queries see, into one varlen segment — costed at the fused shape's efficiency
//! (FCP §4.2: coalescing lets the kernel run at the coalesced size); every other tile (a
//! diagonal, causal one; other query ranges) is costed on its own, so a launch over many small
//! fragments is still as slow as the GPU makes it.

use crate::hashing::FastMap;

use crate::hardware::{Hardware, HardwareError, KernelProfile, KernelQuery, Pass};
use crate::model::Model;
use crate::plan::{allowed_pairs, Mask, Plan, Task, TokenRange};

/// Costs tiles, caching profile lookups by tile shape (plans repeat shapes a lot).
pub struct ComputeModel<'a> {
    hw: &'a Hardware,
    profile: &'a KernelProfile,
    model: &'a Model,
    cache: FastMap<(Pass, Mask, u64, u64), f64>,
    /// Scratch for [`ComputeModel::launch`]'s fused segments, kept between calls so that
    /// costing a step allocates nothing.
    fused: Vec<(FuseKey, u64, f64)>,
}

/// A fused launch segment: the query range (document, start, end) and its heads.
type FuseKey = (u32, u64, u64, Option<(u32, u32)>);

/// Work of one task: its FLOPs and time in seconds (no launch overhead).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TileCost {
    /// FLOPs of the tile for the pass.
    pub flops: f64,
    /// Seconds at the profiled throughput for its shape.
    pub seconds: f64,
}

impl<'a> ComputeModel<'a> {
    /// A compute model for `model` on `hw` with kernel table `profile`.
    pub fn new(hw: &'a Hardware, profile: &'a KernelProfile, model: &'a Model) -> Self {
        ComputeModel {
            hw,
            profile,
            model,
            cache: FastMap::default(),
            fused: Vec::new(),
        }
    }

    /// Achieved TFLOP/s for a tile shape (table value scaled by the compute SM share).
    pub fn tflops(
        &mut self,
        pass: Pass,
        mask: Mask,
        q_len: u64,
        kv_len: u64,
    ) -> Result<f64, HardwareError> {
        let key = (pass, mask, q_len, kv_len);
        if let Some(&t) = self.cache.get(&key) {
            return Ok(t);
        }
        let table = self.profile.tflops_for(&KernelQuery {
            pass,
            mask,
            head_dim: self.model.head_dim,
            q_len,
            kv_len,
            varlen: false,
        })?;
        let t = self.hw.achieved_tflops(table);
        self.cache.insert(key, t);
        Ok(t)
    }

    /// FLOPs of `pairs` allowed (q, k) pairs for `pass`, restricted to a share of the heads:
    /// 4 · pairs · d · h_q forward, 2.5× that backward (design.md).
    pub fn flops(&self, pass: Pass, pairs: u128, head_share: f64) -> f64 {
        let fwd = 4.0 * pairs as f64 * self.model.head_dim as f64 * self.model.q_heads as f64;
        let f = match pass {
            Pass::Fwd => fwd,
            Pass::Bwd => 2.5 * fwd,
        };
        f * head_share
    }

    /// Cost of one task: [`ComputeModel::ranges`] of its query and key ranges on its share of
    /// the heads.
    pub fn tile(
        &mut self,
        plan: &Plan,
        task: &Task,
        pass: Pass,
    ) -> Result<TileCost, HardwareError> {
        let share = task.heads.map_or(1.0, |h| {
            (h.end - h.start) as f64 / plan.q_heads.max(1) as f64
        });
        self.ranges(plan.mask, task.q, task.kv, share, pass)
    }

    /// Cost of the queries `q` against the keys `kv` of one document under the document mask
    /// `mask`, on a `share` of the heads: [`ComputeModel::tile`] without a plan. A range where
    /// the mask allows every pair runs the full-mask kernel; one the diagonal crosses runs the
    /// causal kernel.
    pub fn ranges(
        &mut self,
        mask: Mask,
        q: TokenRange,
        kv: TokenRange,
        share: f64,
        pass: Pass,
    ) -> Result<TileCost, HardwareError> {
        let pairs = allowed_pairs(mask, q.start, q.end, kv.start, kv.end);
        if pairs == 0 {
            return Ok(TileCost {
                flops: 0.0,
                seconds: 0.0,
            });
        }
        let (q, kv) = (q.len(), kv.len());
        let mask = if pairs == q as u128 * kv as u128 {
            Mask::Full
        } else {
            Mask::Causal
        };
        let flops = self.flops(pass, pairs, share);
        let tflops = self.tflops(pass, mask, q, kv)?;
        Ok(TileCost {
            flops,
            seconds: flops / (tflops * 1e12),
        })
    }

    /// Cost of one launch over `tasks` (without launch overhead): unmasked tiles of the same
    /// query range and heads fused into one (see the module doc), the rest one by one.
    pub fn launch(
        &mut self,
        plan: &Plan,
        tasks: &[Task],
        pass: Pass,
    ) -> Result<TileCost, HardwareError> {
        // (q doc, q start, q end, heads) → (fused key tokens, FLOPs): one entry per unmasked
        // task, then sorted by key (stably: a key's FLOPs add up in task order) and summed
        // per key in key order, so sums are deterministic.
        let mut fused = std::mem::take(&mut self.fused);
        fused.clear();
        let total = self.fuse(plan, tasks, pass, &mut fused);
        self.fused = fused;
        total
    }

    /// [`ComputeModel::launch`] with its scratch.
    fn fuse(
        &mut self,
        plan: &Plan,
        tasks: &[Task],
        pass: Pass,
        fused: &mut Vec<(FuseKey, u64, f64)>,
    ) -> Result<TileCost, HardwareError> {
        let mut total = TileCost {
            flops: 0.0,
            seconds: 0.0,
        };
        for t in tasks {
            let pairs = allowed_pairs(plan.mask, t.q.start, t.q.end, t.kv.start, t.kv.end);
            if pairs == 0 {
                continue;
            }
            if pairs == t.q.len() as u128 * t.kv.len() as u128 {
                let share = t.heads.map_or(1.0, |h| {
                    (h.end - h.start) as f64 / plan.q_heads.max(1) as f64
                });
                let key = (
                    t.q.doc,
                    t.q.start,
                    t.q.end,
                    t.heads.map(|h| (h.start, h.end)),
                );
                fused.push((key, t.kv.len(), self.flops(pass, pairs, share)));
            } else {
                let c = self.tile(plan, t, pass)?;
                total.flops += c.flops;
                total.seconds += c.seconds;
            }
        }
        fused.sort_by_key(|e| e.0);
        let mut i = 0;
        while i < fused.len() {
            let (key, mut kv, mut flops) = fused[i];
            let mut j = i + 1;
            while j < fused.len() && fused[j].0 == key {
                kv += fused[j].1;
                flops += fused[j].2;
                j += 1;
            }
            let tflops = self.tflops(pass, Mask::Full, key.2 - key.1, kv)?;
            total.flops += flops;
            total.seconds += flops / (tflops * 1e12);
            i = j;
        }
        Ok(total)
    }

    /// Cost of one step: [`ComputeModel::launch`] plus one launch overhead when it has any
    /// task (the simulator's step time; `hybrid` scores its candidates with it too).
    pub fn step(
        &mut self,
        plan: &Plan,
        tasks: &[Task],
        pass: Pass,
    ) -> Result<TileCost, HardwareError> {
        let mut c = self.launch(plan, tasks, pass)?;
        if !tasks.is_empty() {
            c.seconds += self.launch_overhead_s();
        }
        Ok(c)
    }

    /// Time of one whole document of `len` tokens run as one kernel (the lower bound's unit).
    pub fn whole_document(
        &mut self,
        mask: Mask,
        len: u64,
        pass: Pass,
    ) -> Result<TileCost, HardwareError> {
        let pairs = allowed_pairs(mask, 0, len, 0, len);
        let flops = self.flops(pass, pairs, 1.0);
        let tflops = self.tflops(pass, mask, len, len)?;
        Ok(TileCost {
            flops,
            seconds: flops / (tflops * 1e12),
        })
    }

    /// What the lower bound charges for a whole document. Causal: [`Self::whole_document`]
    /// (within the tables' reading, cutting does not pay; see cost-model.md § Not modelled).
    /// Full mask: its FLOPs at the best rate of any square tile no longer than the document
    /// (the measured full-mask rows up to its length, and its own length): where a table's
    /// full-mask rate falls with length (B200 forward: 1,380 TFLOP/s at 4K, 1,300 at 32K), a
    /// document cut into shorter tiles runs faster than whole. (Regression, bug hunt: ring on
    /// one 32K full-mask document over 8 B200 ranks read 0.954× its "lower bound".)
    pub fn bound_document(
        &mut self,
        mask: Mask,
        len: u64,
        pass: Pass,
    ) -> Result<TileCost, HardwareError> {
        let whole = self.whole_document(mask, len, pass)?;
        if mask == Mask::Causal {
            return Ok(whole);
        }
        let head_dim = self.model.head_dim;
        let shorter: Vec<u64> = self
            .profile
            .rows()
            .iter()
            .filter(|r| {
                r.pass == pass
                    && r.mask == Mask::Full
                    && r.head_dim == head_dim
                    && !r.varlen
                    && r.q_len == r.kv_len
                    && r.q_len < len
            })
            .map(|r| r.q_len)
            .collect();
        let mut best = self.tflops(pass, mask, len, len)?;
        for l in shorter {
            best = best.max(self.tflops(pass, mask, l, l)?);
        }
        Ok(TileCost {
            flops: whole.flops,
            seconds: whole.flops / (best * 1e12),
        })
    }

    /// Launch overhead of one kernel, seconds.
    pub fn launch_overhead_s(&self) -> f64 {
        self.hw.launch_overhead_s()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{bundled, KernelRow};
    use proptest::prelude::*;

    /// Kernel seconds of one causal document of `len` tokens cut at `cuts` (sorted, inside
    /// `1..len`): every tile of the pieces at its own shape, as the compute model costs the
    /// tasks of a plan that cut the document. No launch overhead (it would only add to the cut).
    fn cut_seconds(cm: &mut ComputeModel<'_>, len: u64, cuts: &[u64], pass: Pass) -> f64 {
        let bounds: Vec<u64> = std::iter::once(0)
            .chain(cuts.iter().copied())
            .chain(std::iter::once(len))
            .collect();
        let mut seconds = 0.0;
        for (i, q) in bounds.windows(2).enumerate() {
            for kv in bounds.windows(2).take(i + 1) {
                let range = |r: &[u64]| TokenRange::new(0, r[0], r[1]);
                seconds += cm
                    .ranges(Mask::Causal, range(q), range(kv), 1.0, pass)
                    .unwrap()
                    .seconds;
            }
        }
        seconds
    }

    /// Every bundled kernel profile with causal and full hd-128 rows, with a model and
    /// hardware of that head dim.
    fn profiles() -> Vec<(KernelProfile, Hardware, Model)> {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-70b").unwrap();
        bundled::names(bundled::KERNEL_PROFILES)
            .into_iter()
            .map(|name| {
                (
                    KernelProfile::load(name).unwrap(),
                    hw.clone(),
                    model.clone(),
                )
            })
            .collect()
    }

    /// The single-document hd-128 causal rows of a profile for `pass`.
    fn causal_rows(p: &KernelProfile, pass: Pass) -> impl Iterator<Item = &KernelRow> {
        p.rows().iter().filter(move |r| {
            r.pass == pass && r.mask == Mask::Causal && r.head_dim == 128 && !r.varlen
        })
    }

    fn shortest_causal_row(p: &KernelProfile, pass: Pass) -> Option<u64> {
        causal_rows(p, pass).map(|r| r.q_len.min(r.kv_len)).min()
    }

    fn longest_causal_row(p: &KernelProfile, pass: Pass) -> Option<u64> {
        causal_rows(p, pass).map(|r| r.q_len.max(r.kv_len)).max()
    }

    /// Kernel seconds of a causal document of `len` tokens cut at `cuts`, and of it whole.
    fn cut_and_whole(cm: &mut ComputeModel<'_>, len: u64, cuts: &[u64], pass: Pass) -> (f64, f64) {
        let whole = cm.whole_document(Mask::Causal, len, pass).unwrap().seconds;
        (cut_seconds(cm, len, cuts, pass), whole)
    }

    /// (pass, cut seconds, whole seconds) of a causal document of `len` tokens cut at `cuts`
    /// on the H100 table, forward and backward.
    fn cut_and_whole_on_h100(len: u64, cuts: &[u64]) -> Vec<(Pass, f64, f64)> {
        let (p, hw, model) = &profiles()[0];
        assert_eq!(p.name, "h100-fa3");
        let mut cm = ComputeModel::new(hw, p, model);
        [Pass::Fwd, Pass::Bwd]
            .into_iter()
            .map(|pass| {
                let (cut, whole) = cut_and_whole(&mut cm, len, cuts, pass);
                (pass, cut, whole)
            })
            .collect()
    }

    /// The bug: with both masks clamped to their shortest rows below the table, a 600-token
    /// causal document cut at 300 cost 25 % less than whole on the H100 table (its
    /// off-diagonal tile ran at the full-mask row, twice the causal one), and zigzag beat the
    /// lower bound.
    #[test]
    fn a_short_causal_document_cut_in_two_is_not_cheaper_than_whole() {
        for (pass, cut, whole) in cut_and_whole_on_h100(600, &[300]) {
            assert!(
                cut >= whole * (1.0 - 1e-12),
                "{pass:?}: cut {cut} vs whole {whole}"
            );
        }
    }

    /// The bug: above the tables' longest row (32K) causal tiles were clamped to that row,
    /// which runs under the full-mask one (H100 forward 680 against 701 TFLOP/s), so a 128K
    /// causal document cut into four 32K pieces cost 2 % less than whole and plans that cut
    /// long documents beat the lower bound. Priced as cut into 32K pieces, the whole costs
    /// what its pieces do (to 1e-6: the rule counts a diagonal piece's pairs as side²/2, the
    /// plan as side·(side+1)/2).
    #[test]
    fn a_long_causal_document_cut_at_the_longest_row_costs_the_whole() {
        for (pass, cut, whole) in cut_and_whole_on_h100(4 * 32768, &[32768, 65536, 98304]) {
            assert!(
                (cut - whole).abs() <= 1e-6 * whole,
                "{pass:?}: cut {cut} vs whole {whole}"
            );
        }
    }

    proptest! {
        /// Above every bundled table's longest row, no cut of a causal document into pieces
        /// at least that long costs less than the whole: where the pieces rule prices the
        /// whole (`KernelProfile::lookup`) the two are equal, and where the clamp is faster
        /// (B200 forward) the off-diagonal pieces only run slower.
        #[test]
        fn above_the_table_a_cut_into_long_pieces_never_beats_the_whole(
            extra in proptest::collection::vec(0.0f64..3.0, 1..6),
            bwd in any::<bool>(),
        ) {
            let pass = if bwd { Pass::Bwd } else { Pass::Fwd };
            for (p, hw, model) in &profiles() {
                let Some(longest) = longest_causal_row(p, pass) else { continue };
                let pieces: Vec<u64> = extra
                    .iter()
                    .map(|x| longest + (x * longest as f64) as u64)
                    .collect();
                let cuts: Vec<u64> = pieces
                    .iter()
                    .scan(0, |at, p| {
                        *at += p;
                        Some(*at)
                    })
                    .collect();
                let len = *cuts.last().unwrap() + longest;
                let mut cm = ComputeModel::new(hw, p, model);
                let (cut, whole) = cut_and_whole(&mut cm, len, &cuts, pass);
                prop_assert!(cut >= whole * (1.0 - 1e-6), "{} {pass:?} len {len} cuts {cuts:?}: {cut} < {whole}", p.name);
            }
        }

        /// Below every bundled table's shortest row, no cut of a causal document costs less
        /// than the document whole: every piece runs at the shortest causal row's rate (a
        /// full-mask piece is held to a causal tile of twice its side, `KernelProfile::lookup`),
        /// and the pieces' pairs add up to the whole's.
        #[test]
        fn below_the_table_a_cut_never_beats_the_whole(
            frac in 0.0f64..1.0,
            raw_cuts in proptest::collection::vec(0.0f64..1.0, 1..8),
            bwd in any::<bool>(),
        ) {
            let pass = if bwd { Pass::Bwd } else { Pass::Fwd };
            for (p, hw, model) in &profiles() {
                let Some(shortest) = shortest_causal_row(p, pass) else { continue };
                let len = 2 + (frac * (shortest - 2) as f64) as u64;
                let mut cuts: Vec<u64> = raw_cuts
                    .iter()
                    .map(|c| 1 + (c * (len - 1) as f64) as u64)
                    .filter(|&c| c < len)
                    .collect();
                cuts.sort_unstable();
                cuts.dedup();
                let mut cm = ComputeModel::new(hw, p, model);
                let (cut, whole) = cut_and_whole(&mut cm, len, &cuts, pass);
                prop_assert!(cut >= whole * (1.0 - 1e-12), "{} {pass:?} len {len} cuts {cuts:?}: {cut} < {whole}", p.name);
            }
        }

        /// At any length, cutting a causal document into k equal pieces costs at least 98 % of
        /// running it whole on every bundled table. It is not exactly a bound: inside the
        /// tables a few measured rows dip below shorter ones (H100 forward causal 657 at 8K
        /// against 662 at 4K), and a cut into pieces of the faster length saves up to 1.9 %.
        /// Clamping full-mask tiles to their own shortest row failed this at 600 tokens (0.75);
        /// clamping causal tiles above the longest row failed it at 700K tokens (0.95).
        #[test]
        fn at_any_length_a_cut_costs_nearly_the_whole(
            log_len in 1.0f64..19.0,
            k in 2u64..16,
            bwd in any::<bool>(),
        ) {
            let pass = if bwd { Pass::Bwd } else { Pass::Fwd };
            let len = (2f64.powf(log_len) as u64).max(k);
            let cuts: Vec<u64> = (1..k).map(|i| len * i / k).collect();
            for (p, hw, model) in &profiles() {
                if shortest_causal_row(p, pass).is_none() {
                    continue;
                }
                let mut cm = ComputeModel::new(hw, p, model);
                let (cut, whole) = cut_and_whole(&mut cm, len, &cuts, pass);
                prop_assert!(cut >= 0.98 * whole, "{} {pass:?} len {len} k {k}: {cut} vs {whole}", p.name);
            }
        }
    }
}
