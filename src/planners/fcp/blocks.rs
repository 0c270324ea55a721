//! FCP's block distributor, sharding half (§4.1): documents → fixed-size blocks → assignment
//! units, each weighed by f(B) from the shared cost model.

use std::collections::BTreeMap;

use crate::hashing::FastMap;

use crate::hardware::{cost, Hardware, KernelProfile, KernelQuery, Pass};
use crate::model::Model;
use crate::plan::{allowed_pairs, Mask, PlanError, TokenRange};
use crate::trace::Batch;

/// A set of tokens placed together. Long documents give one-chunk blocks of `block` tokens
/// (the last one shorter); documents shorter than a block are packed, whole, several to a
/// block, and the block runs as one varlen launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// Token ranges of the block, each inside one document. A packed block holds one whole
    /// short document per chunk.
    pub chunks: Vec<TokenRange>,
    /// Whether this is a pack of short documents (costed as one varlen launch).
    pub packed: bool,
}

impl Block {
    /// Tokens in the block.
    pub fn tokens(&self) -> u64 {
        self.chunks.iter().map(TokenRange::len).sum()
    }
}

/// What LPT assigns: one block, or a zig-zag pair of blocks of one causal document.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// The unit's blocks (one or two).
    pub blocks: Vec<Block>,
    /// f(unit): seconds of attention its queries compute, forward plus backward.
    pub weight: f64,
    /// Estimated K/V tokens the unit sends plus receives if every other block of its document
    /// sits on another rank ([`set_comm`]); 0 for packs of short documents, which never move.
    /// LPT's second key (see `lpt::assign`).
    pub comm: f64,
    /// With the reshuffler: the rank holding most of the unit's tokens in the user's layout
    /// ([`set_homes`]), where placing it moves least.
    pub home: Option<u32>,
    /// The unit [`make_units`] cut it from (its index there): the two halves of a broken
    /// zig-zag pair, and the pieces of a split block, share their origin. Node-grouped
    /// placement keeps them together, so each node receives whole pairs and its ranks can be
    /// paired back to equal loads (`node_lpt`).
    pub origin: u32,
}

impl Unit {
    /// Tokens in the unit.
    pub fn tokens(&self) -> u64 {
        self.blocks.iter().map(Block::tokens).sum()
    }
}

/// Cut every document into blocks and group them into units (unweighted; see [`Weigher`]).
///
/// * A document longer than `block` gives `⌈len/block⌉` blocks `[i·block, (i+1)·block)`.
///   Under a causal mask block `i` is paired with block `k−1−i` (the middle block of an odd
///   count stays alone): an early block's queries see few keys but its K/V is wanted by
///   every later block, a late block the reverse, so a pair's compute and the K/V it sends
///   both stay close to the document average (seed §3.2, Figure 4). Under a full mask every
///   block is already alike and is its own unit.
/// * Documents of at most `block` tokens are packed whole into the fewest blocks we can find
///   (best-fit decreasing: longest first into the fullest block it fits, ties by document id;
///   at most 11/9·OPT + 1 blocks, O(D log D)), so they never move.
pub fn make_units(batch: &Batch, block: u64, mask: Mask) -> Vec<Unit> {
    make_units_grouped(batch, block, mask, &[], 0)
}

/// [`make_units`], packing short documents only with documents of the same group
/// (`group[doc]`; absent = one group): with the reshuffler, a group is the rank that holds the
/// document in the user's layout, so a pack can stay where the user put it.
///
/// With `whole` > `block`, every document of at most `whole` tokens is kept whole, each its
/// own unit (a one-document pack: one launch, no traffic), short ones included — the
/// Whole-Doc half of FlashCP's idea, used by `hybrid`; `whole` ≤ `block` changes nothing.
pub fn make_units_grouped(
    batch: &Batch,
    block: u64,
    mask: Mask,
    group: &[u32],
    whole: u64,
) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut short: Vec<(u32, u64, u32)> = Vec::new();
    for (doc, &len) in batch.doc_lens.iter().enumerate() {
        let doc = doc as u32;
        // With a whole-document threshold, every document up to it is its own unit — short
        // ones too: packs of several would only coarsen LPT's balance, since each document
        // is its own tile either way.
        if len <= block && whole <= block {
            short.push((group.get(doc as usize).copied().unwrap_or(0), len, doc));
            continue;
        }
        if len <= whole.max(block) {
            units.push(unit(
                vec![Block {
                    chunks: vec![TokenRange::new(doc, 0, len)],
                    packed: true,
                }],
                units.len(),
            ));
            continue;
        }
        let k = len.div_ceil(block);
        let blk = |i: u64| Block {
            chunks: vec![TokenRange::new(doc, i * block, ((i + 1) * block).min(len))],
            packed: false,
        };
        match mask {
            Mask::Causal => {
                for i in 0..k / 2 {
                    units.push(unit(vec![blk(i), blk(k - 1 - i)], units.len()));
                }
                if k % 2 == 1 {
                    units.push(unit(vec![blk(k / 2)], units.len()));
                }
            }
            Mask::Full => {
                for i in 0..k {
                    units.push(unit(vec![blk(i)], units.len()));
                }
            }
        }
    }
    // Best-fit decreasing over short documents, group by group.
    short.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut bins: Vec<Vec<TokenRange>> = Vec::new();
    let mut by_free: BTreeMap<(u64, usize), ()> = BTreeMap::new();
    let mut current = None;
    for (g, len, doc) in short {
        if current != Some(g) {
            by_free.clear();
            current = Some(g);
        }
        let found = by_free.range((len, 0)..).next().map(|(&k, _)| k);
        let (free, bin) = match found {
            Some(k) => {
                by_free.remove(&k);
                k
            }
            None => {
                bins.push(Vec::new());
                (block, bins.len() - 1)
            }
        };
        bins[bin].push(TokenRange::new(doc, 0, len));
        if free > len {
            by_free.insert((free - len, bin), ());
        }
    }
    for chunks in bins {
        units.push(unit(
            vec![Block {
                chunks,
                packed: true,
            }],
            units.len(),
        ));
    }
    units
}

/// Break every pair `heavy` says is too coarse into two one-block units, each re-weighed
/// (their `comm` is left 0: call [`set_comm`] again), keeping the unit order. Returns how many
/// pairs were broken.
pub fn break_heavy_pairs(
    units: &mut Vec<Unit>,
    heavy: impl Fn(&Unit) -> bool,
    weigher: &mut Weigher<'_>,
    doc_lens: &[u64],
) -> Result<usize, PlanError> {
    let mut broken = 0;
    let mut out = Vec::with_capacity(units.len());
    for u in units.drain(..) {
        if u.blocks.len() > 1 && heavy(&u) {
            broken += 1;
            for b in &u.blocks {
                out.push(one_block_unit(b.clone(), &u, weigher, doc_lens)?);
            }
        } else {
            out.push(u);
        }
    }
    *units = out;
    Ok(broken)
}

/// Halve every one-block unit of a long document that `heavy` says is too coarse, again and
/// again, until each piece passes or is down to `min_tokens` (pieces are re-weighed; `comm`
/// is left 0: call [`set_comm`] again). Returns how many splits were made.
///
/// Why: under a causal mask the last block of a document of length L does about
/// `block · L` of work — at 256 ranks the last 2K block of a 300K-token document outweighs a
/// rank's whole share, and no placement of whole blocks can then be balanced. Queries cut
/// finer there keep their tiles long (the kernel's efficiency follows √(q · kv), and kv is
/// the whole prefix), so the pieces cost little efficiency; only the tail of the heaviest
/// documents is cut, where FCP's fixed block is too coarse.
pub fn split_heavy_blocks(
    units: &mut Vec<Unit>,
    heavy: impl Fn(&Unit) -> bool,
    min_tokens: u64,
    weigher: &mut Weigher<'_>,
    doc_lens: &[u64],
) -> Result<usize, PlanError> {
    let mut splits = 0;
    let mut out = Vec::with_capacity(units.len());
    let mut todo: Vec<Unit> = Vec::new();
    for u in units.drain(..) {
        todo.push(u);
        while let Some(u) = todo.pop() {
            let piece = match u.blocks.as_slice() {
                [b] if !b.packed && b.chunks.len() == 1 => Some(b.chunks[0]),
                _ => None,
            };
            let c = match piece {
                Some(c) if c.len() >= 2 * min_tokens.max(1) && heavy(&u) => c,
                _ => {
                    out.push(u);
                    continue;
                }
            };
            splits += 1;
            let mid = c.start + c.len() / 2;
            // Pushed last-first so the pieces come out in token order.
            for (start, end) in [(mid, c.end), (c.start, mid)] {
                let b = Block {
                    chunks: vec![TokenRange::new(c.doc, start, end)],
                    packed: false,
                };
                todo.push(one_block_unit(b, &u, weigher, doc_lens)?);
            }
        }
    }
    *units = out;
    Ok(splits)
}

/// A unit of one block of `from`, weighed (its `comm` left 0 for [`set_comm`]): what breaking
/// a pair and splitting a heavy block both produce. It keeps `from`'s home and origin.
fn one_block_unit(
    b: Block,
    from: &Unit,
    weigher: &mut Weigher<'_>,
    doc_lens: &[u64],
) -> Result<Unit, PlanError> {
    let weight = weigher.block(&b, doc_lens)?;
    Ok(Unit {
        blocks: vec![b],
        weight,
        comm: 0.0,
        home: from.home,
        origin: from.origin,
    })
}

/// A fresh unit of `blocks`, the `origin`-th that [`make_units`] cuts.
fn unit(blocks: Vec<Block>, origin: usize) -> Unit {
    Unit {
        blocks,
        weight: 0.0,
        comm: 0.0,
        home: None,
        origin: origin as u32,
    }
}

/// Set every unit's home: the rank of `layout_cuts` (rank `i` holds packed positions
/// `[cuts[i], cuts[i + 1])`, documents back to back in order) that holds most of its tokens.
pub fn set_homes(units: &mut [Unit], doc_lens: &[u64], cuts: &[u64]) {
    let mut offset = Vec::with_capacity(doc_lens.len());
    let mut acc = 0u64;
    for &l in doc_lens {
        offset.push(acc);
        acc += l;
    }
    for u in units {
        let mut best: Option<(u64, u32)> = None;
        let mut tally: Vec<(u32, u64)> = Vec::new();
        for c in u.blocks.iter().flat_map(|b| &b.chunks) {
            let (s, e) = (
                offset[c.doc as usize] + c.start,
                offset[c.doc as usize] + c.end,
            );
            let mut i = cuts.partition_point(|&x| x <= s).saturating_sub(1);
            while i + 1 < cuts.len() && cuts[i] < e {
                let n = e.min(cuts[i + 1]).saturating_sub(s.max(cuts[i]));
                if n > 0 {
                    match tally.iter_mut().find(|t| t.0 == i as u32) {
                        Some(t) => t.1 += n,
                        None => tally.push((i as u32, n)),
                    }
                }
                i += 1;
            }
        }
        for &(r, n) in &tally {
            if best.is_none_or(|(m, br)| n > m || (n == m && r < br)) {
                best = Some((n, r));
            }
        }
        u.home = best.map(|b| b.1);
    }
}

/// Estimate each unit's K/V traffic (tokens sent + received), assuming every other block of
/// its document lands on another rank — what LPT's comm window balances.
///
/// A block `[s, e)` of a long document of `L` tokens cut in `block`-token blocks receives the
/// K/V it reads from other blocks (causal: the `s` tokens before it; full: the other `L − len`)
/// and sends its own `len` tokens to every block that reads them (causal: the
/// `⌈(L − e)/block⌉` blocks after it; full: all `⌈L/block⌉ − 1` others). So under a causal mask
/// sent + received is about `(k − 1)·block` for every block of a `k`-block document, whatever
/// its position, while its compute grows with the position: a heavy late block and a light
/// early block move the same bytes, which is why balancing compute alone leaves comm unbalanced.
/// The two blocks of a zig-zag pair share a rank, so the pair does not move the earlier block
/// to the later one (−2·len of the earlier block). Packs move nothing.
pub fn set_comm(units: &mut [Unit], doc_lens: &[u64], block: u64, mask: Mask) {
    let block = block.max(1);
    for u in units {
        let mut c = 0.0;
        for b in u.blocks.iter().filter(|b| !b.packed) {
            for ch in &b.chunks {
                let (len, l) = (ch.len(), doc_lens[ch.doc as usize]);
                let (recv, readers) = match mask {
                    Mask::Causal => (ch.start, (l - ch.end).div_ceil(block)),
                    Mask::Full => (l - len, l.div_ceil(block).saturating_sub(1)),
                };
                c += (recv + len * readers) as f64;
            }
        }
        if let [a, b] = &u.blocks[..] {
            if !a.packed && !b.packed && mask == Mask::Causal {
                let early = a.chunks[0].start.min(b.chunks[0].start);
                let len = if a.chunks[0].start == early {
                    a.tokens()
                } else {
                    b.tokens()
                };
                c -= 2.0 * len as f64;
            }
        }
        u.comm = c.max(0.0);
    }
}

type TileKey = (Mask, u64, u64, u128, bool);

/// f(B) from the shared cost model ([`cost::kernel_time_s`]), forward plus backward, with
/// lookups memoised: block tiles repeat the same few shapes, and the planner must stay fast.
///
/// f is costed the way the simulator costs the plan's tasks (`sim::ComputeModel`): every task
/// is one (query chunk × key chunk) tile at its own shape's efficiency, without launch overhead
/// (the simulator adds one per step, and a step holds many tiles). A pack of short documents is
/// one tile per document — so a pack of many tiny documents weighs what their tiny tiles really
/// cost, not what one 4K launch would — and a block of a long document is its diagonal tile
/// plus one tile per earlier block it reads. (An earlier version weighed packs as one varlen
/// launch over the whole block and the off-diagonal keys as one long tile; the simulator then
/// found up to 12% compute imbalance on plans LPT thought were within 1%.)
pub struct Weigher<'a> {
    hw: &'a Hardware,
    profile: KernelProfile,
    model: &'a Model,
    mask: Mask,
    cache: FastMap<TileKey, f64>,
}

impl<'a> Weigher<'a> {
    /// A weigher for `mask` on `hw` / `model`.
    pub fn new(hw: &'a Hardware, model: &'a Model, mask: Mask) -> Result<Self, PlanError> {
        let profile = hw
            .kernel_profile()
            .map_err(|e| PlanError::Planning(format!("fcp: cost model: {e}")))?;
        Ok(Weigher {
            hw,
            profile,
            model,
            mask,
            cache: FastMap::default(),
        })
    }

    /// Forward + backward seconds of one tile of `q_len` × `kv_len` tokens with `pairs`
    /// allowed pairs under `mask`, without launch overhead.
    fn tile(&mut self, mask: Mask, q_len: u64, kv_len: u64, pairs: u128) -> Result<f64, PlanError> {
        if pairs == 0 {
            return Ok(0.0);
        }
        let key = (mask, q_len, kv_len, pairs, false);
        if let Some(&t) = self.cache.get(&key) {
            return Ok(t);
        }
        let mut total = 0.0;
        for pass in [Pass::Fwd, Pass::Bwd] {
            let q = KernelQuery {
                pass,
                mask,
                head_dim: self.model.head_dim,
                q_len,
                kv_len,
                varlen: false,
            };
            total += cost::kernel_time_s(self.hw, &self.profile, self.model, &q, pairs)
                .map_err(|e| PlanError::Planning(format!("fcp: cost model: {e}")))?
                - self.hw.launch_overhead_s();
        }
        self.cache.insert(key, total);
        Ok(total)
    }

    /// Unmasked tiles of `q` queries against `kv` keys cut in blocks: `kv / block` full-block
    /// tiles and one tile of the remainder.
    fn blocked(&mut self, q: u64, kv: u64) -> Result<f64, PlanError> {
        if kv == 0 {
            return Ok(0.0);
        }
        // The simulator fuses a query range's unmasked tiles of one launch
        // (`sim::ComputeModel::launch`); coalesced stages bring most of a block's earlier keys
        // in one launch, so they are weighed as one fused tile.
        self.tile(Mask::Full, q, kv, q as u128 * kv as u128)
    }

    /// f of the queries of `chunk` (a range of a document of `doc_len` tokens) against every key
    /// they may see. Causal: the diagonal tile (causal kernel) plus one fused unmasked tile over
    /// every earlier key; full: one fused unmasked tile over the document.
    pub fn chunk(&mut self, chunk: TokenRange, doc_len: u64) -> Result<f64, PlanError> {
        let q = chunk.len();
        match self.mask {
            Mask::Causal => {
                let diag =
                    allowed_pairs(Mask::Causal, chunk.start, chunk.end, chunk.start, chunk.end);
                Ok(self.tile(Mask::Causal, q, q, diag)? + self.blocked(q, chunk.start)?)
            }
            Mask::Full => self.blocked(q, doc_len),
        }
    }

    /// f of a block: one tile per document for a pack of short documents (the mask's kernel
    /// over the whole document); a block of a long document is its chunk's tiles.
    pub fn block(&mut self, b: &Block, doc_lens: &[u64]) -> Result<f64, PlanError> {
        let mut t = 0.0;
        for &c in &b.chunks {
            t += if b.packed {
                let pairs = allowed_pairs(self.mask, c.start, c.end, c.start, c.end);
                self.tile(self.mask, c.len(), c.len(), pairs)?
            } else {
                self.chunk(c, doc_lens[c.doc as usize])?
            };
        }
        Ok(t)
    }

    /// Weigh every unit in place.
    pub fn weigh(&mut self, units: &mut [Unit], doc_lens: &[u64]) -> Result<(), PlanError> {
        for u in units {
            let mut w = 0.0;
            for b in &u.blocks {
                w += self.block(b, doc_lens)?;
            }
            u.weight = w;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(u: &Unit) -> Vec<(u32, u64, u64)> {
        u.blocks
            .iter()
            .flat_map(|b| &b.chunks)
            .map(|c| (c.doc, c.start, c.end))
            .collect()
    }

    #[test]
    fn long_causal_documents_pair_zigzag() {
        // 10 tokens in blocks of 3: blocks [0,3) [3,6) [6,9) [9,10); pairs (0,3), (1,2).
        let units = make_units(&Batch::new(0, vec![10]), 3, Mask::Causal);
        let got: Vec<_> = units.iter().map(ranges).collect();
        assert_eq!(
            got,
            vec![vec![(0, 0, 3), (0, 9, 10)], vec![(0, 3, 6), (0, 6, 9)]]
        );
        // Odd block count: the middle block alone.
        let units = make_units(&Batch::new(0, vec![9]), 3, Mask::Causal);
        let got: Vec<_> = units.iter().map(ranges).collect();
        assert_eq!(got, vec![vec![(0, 0, 3), (0, 6, 9)], vec![(0, 3, 6)]]);
    }

    #[test]
    fn full_mask_blocks_stand_alone() {
        let units = make_units(&Batch::new(0, vec![7]), 3, Mask::Full);
        assert_eq!(units.len(), 3);
        assert!(units.iter().all(|u| u.blocks.len() == 1));
    }

    #[test]
    fn short_documents_pack_into_fewest_blocks() {
        // 6+4 and 5+5 fill two blocks of 10 exactly; 3 and 2 share a third.
        let units = make_units(&Batch::new(0, vec![5, 6, 3, 4, 5, 2]), 10, Mask::Causal);
        assert_eq!(units.len(), 3);
        let sizes: Vec<u64> = units.iter().map(Unit::tokens).collect();
        assert_eq!(sizes, vec![10, 10, 5]);
        assert!(units.iter().all(|u| u.blocks[0].packed));
        // A document of exactly one block is packed (alone), not split.
        let units = make_units(&Batch::new(0, vec![10]), 10, Mask::Causal);
        assert_eq!(units.len(), 1);
        assert!(units[0].blocks[0].packed);
    }

    #[test]
    fn weights_grow_along_a_causal_document() {
        crate::planners::testing::with_ctx(2, Mask::Causal, |ctx| {
            let mut w = Weigher::new(ctx.hardware, ctx.model, Mask::Causal).unwrap();
            let early = w.chunk(TokenRange::new(0, 0, 4096), 16384).unwrap();
            let late = w.chunk(TokenRange::new(0, 12288, 16384), 16384).unwrap();
            assert!(late > 5.0 * early, "{early} {late}");
            // Pair weights of a 4-block document are equal up to the kernel efficiency of the
            // off-diagonal tile sizes.
            let mut units = make_units(&Batch::new(0, vec![16384]), 4096, Mask::Causal);
            w.weigh(&mut units, &[16384]).unwrap();
            let (a, b) = (units[0].weight, units[1].weight);
            assert!((a - b).abs() / a.max(b) < 0.1, "{a} {b}");
        });
    }
}
