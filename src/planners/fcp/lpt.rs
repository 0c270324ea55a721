//! FCP's block distributor, assignment half (§4.1): LPT under a strict per-rank token cap.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::blocks::{Block, Unit};
use crate::plan::TokenRange;
use crate::planners::repair::Item;

/// A rank's load as a heap key: f64 seconds ordered totally, ties by rank id; the last field
/// is the rank's push count, so only its newest entry is live (lazy deletion).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key(f64, u32, u32);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .total_cmp(&other.0)
            .then(self.1.cmp(&other.1))
            .then(self.2.cmp(&other.2))
    }
}

/// Where LPT put everything.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Chunks each rank owns, in the order they were given.
    pub owned: Vec<Vec<TokenRange>>,
    /// f-load of each rank (seconds, forward + backward).
    pub loads: Vec<f64>,
    /// Tokens of each rank.
    pub tokens: Vec<u64>,
    /// Estimated K/V tokens each rank sends plus receives (Σ [`Unit::comm`] of its units).
    pub comm: Vec<f64>,
    /// Pairs that had to be placed as two separate blocks because no rank could hold both.
    pub split_pairs: usize,
    /// Blocks that had to be cut across ranks because no rank could hold them whole.
    pub split_blocks: usize,
    /// Every piece as placed (a unit, a block of a split pair, a cut piece), for the traffic
    /// repair ([`crate::planners::repair`]).
    pub items: Vec<Item>,
    /// The rank of each of `items`.
    pub item_rank: Vec<u32>,
}

impl Assignment {
    /// Re-derive `owned`, `loads` and `tokens` from `items` placed on `item_rank` (after a
    /// repair moved some), keeping each rank's chunks in item order.
    pub fn regroup(&mut self) {
        let n = self.owned.len();
        self.owned = vec![Vec::new(); n];
        self.loads = vec![0.0; n];
        self.tokens = vec![0; n];
        for (it, &r) in self.items.iter().zip(&self.item_rank) {
            let r = r as usize;
            self.owned[r].extend_from_slice(&it.chunks);
            self.loads[r] += it.weight;
            self.tokens[r] += it.tokens();
        }
    }
}

/// LPT: units by weight, heaviest first (ties by unit index), each to the least-loaded rank
/// (ties by rank id) that still has room for it under `cap` tokens. O(K log N) for K units and
/// N ranks while the least-loaded rank has room; ranks that are full are dropped from the heap.
///
/// When no rank has room for a unit whole, a pair is placed as two blocks, and a block that
/// still fits nowhere is cut across the ranks with the most free room (largest first, ties by
/// id). A max-heap of free room answers "does anything fit" in O(log N), so every placement,
/// split or cut costs O(log N) amortised plus the ranks it skips. This only happens at the cap's margin, and it makes the cap strict without
/// ever failing: callers ensure `ranks × cap ≥` the batch's tokens.
pub fn assign(units: &[Unit], ranks: u32, cap: u64) -> Assignment {
    assign_with(units, ranks, cap, Options::default())
}

/// LPT's second resource.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Options {
    /// Balance communication too: a unit that moves K/V ([`Unit::comm`] > 0) goes to the rank
    /// with room that minimises `max((load + w)/mean_load, (comm + c)/mean_comm)` — the larger
    /// of its compute and comm shares after taking the unit (ties: less load, lower id) — instead
    /// of the least-loaded rank. Packs of short documents move nothing and still go to the
    /// least-loaded rank, so they fill the compute gaps the comm-aware choices leave.
    pub comm_aware: bool,
    /// Reshuffler affinity, as a fraction of the mean rank load: a unit goes to its
    /// [`Unit::home`] instead of the rank chosen above when the home has room and is at most
    /// this much more loaded (plus, comm-aware, this much higher in its comm share), so it need
    /// not move from where the user's layout put it. Each such choice can leave a rank at most
    /// that much above LPT's choice (0 = off).
    pub affinity: f64,
    /// Also place by the fill rule and keep whichever of the two assignments leaves the
    /// busiest rank lighter (ties: LPT's). Under the fill rule a unit that moves no K/V goes
    /// to the rank with room whose load after taking it, plus its remaining room filled at
    /// the density of what is still to place (weight left / room left), is least (ties: less
    /// load, lower id): when the batch fills its budget every rank must end full, and a rank
    /// that takes a dense document must fill the rest of its room with light ones, which
    /// plain LPT ignores until no light ones are left — redpajama at 256 ranks, whose
    /// 32.5K-token document is 0.98 of a node's mean load, left its node at 1.09 × the mean
    /// under LPT and 1.06 (the best any whole-document placement can do) under the fill rule.
    /// O(N) per unit instead of O(log N).
    pub fill: bool,
}

/// [`assign`] with [`Options`].
pub fn assign_with(units: &[Unit], ranks: u32, cap: u64, opts: Options) -> Assignment {
    let lpt = assign_by(units, ranks, cap, opts, false);
    if !opts.fill {
        return lpt;
    }
    let fill = assign_by(units, ranks, cap, opts, true);
    let busiest = |a: &Assignment| a.loads.iter().copied().fold(0.0, f64::max);
    if busiest(&fill) < busiest(&lpt) {
        fill
    } else {
        lpt
    }
}

/// LPT, or with `fill` the fill rule ([`Options::fill`]).
fn assign_by(units: &[Unit], ranks: u32, cap: u64, opts: Options, fill: bool) -> Assignment {
    let n = ranks as usize;
    let per_rank = |x: f64| x / f64::from(ranks.max(1));
    let mean_load = per_rank(units.iter().map(|u| u.weight).sum());
    let mean_comm = per_rank(units.iter().map(|u| u.comm).sum());
    let mut order: Vec<usize> = (0..units.len()).collect();
    // Comm-aware: units that move K/V first, so that packs — which move nothing and come in
    // all sizes — fill the compute gaps and the token room those choices leave.
    let first = |u: &Unit| opts.comm_aware && u.comm > 0.0;
    order.sort_by(|&a, &b| {
        first(&units[b])
            .cmp(&first(&units[a]))
            .then(units[b].weight.total_cmp(&units[a].weight))
            .then(a.cmp(&b))
    });
    // Smallest block still to come: a rank with less room can never take a whole block
    // again and leaves the heap for good (room only shrinks, this floor only grows).
    let mut min_after = vec![u64::MAX; order.len() + 1];
    for i in (0..order.len()).rev() {
        let smallest = units[order[i]].blocks.iter().map(Block::tokens).min();
        min_after[i] = min_after[i + 1].min(smallest.unwrap_or(0));
    }
    // Weight still to place from each unit on (the fill rule's density).
    let mut weight_from = vec![0.0; order.len() + 1];
    for i in (0..order.len()).rev() {
        weight_from[i] = weight_from[i + 1] + units[order[i]].weight;
    }
    let mut st = State {
        heaps: {
            let mut h = vec![BinaryHeap::new(); 64];
            if cap > 0 {
                h[class(cap)] = (0..ranks).map(|r| Reverse(Key(0.0, r, 0))).collect();
            }
            h
        },
        version: vec![0; n],
        room: (0..ranks).map(|r| (cap, Reverse(r))).collect(),
        free: vec![cap; n],
        a: Assignment {
            owned: vec![Vec::new(); n],
            loads: vec![0.0; n],
            tokens: vec![0; n],
            comm: vec![0.0; n],
            split_pairs: 0,
            split_blocks: 0,
            items: Vec::new(),
            item_rank: Vec::new(),
        },
        skipped: Vec::new(),
        floor: 0,
        comm_aware: opts.comm_aware && mean_load > 0.0 && mean_comm > 0.0,
        affinity: opts.affinity.max(0.0),
        home: None,
        mean_load,
        mean_comm,
        fill,
        weight_left: 0.0,
        free_total: cap * u64::from(ranks),
    };
    for (i, &u) in order.iter().enumerate() {
        st.floor = min_after[i];
        st.weight_left = weight_from[i + 1];
        let unit = &units[u];
        st.home = unit.home;
        if st.place_whole(&unit.blocks, unit.tokens(), unit.weight, unit.comm) {
            continue;
        }
        if unit.blocks.len() > 1 {
            st.a.split_pairs += 1;
        }
        // Heavier block first; weights split by tokens (the unit's f is not per block).
        let mut blocks: Vec<&Block> = unit.blocks.iter().collect();
        blocks.sort_by_key(|b| Reverse(b.tokens()));
        for b in blocks {
            let share = b.tokens() as f64 / unit.tokens().max(1) as f64;
            let (w, c) = (unit.weight * share, unit.comm * share);
            st.home = None;
            if !st.place_whole(std::slice::from_ref(b), b.tokens(), w, c) {
                st.a.split_blocks += 1;
                st.cut(b, w);
            }
        }
    }
    // `owned` is derived from the placed items (the same order, and the same sums).
    st.a.regroup();
    st.a
}

struct State {
    /// Min-heaps of rank loads, one per room class ⌊log2 free⌋ (lazy: an entry is live only
    /// if its version is the rank's). Every rank in a class above ⌊log2 t⌋ has room for `t`
    /// tokens, so only the class of `t` itself ever needs skipping.
    heaps: Vec<BinaryHeap<Reverse<Key>>>,
    version: Vec<u32>,
    /// Max-heap of free room, ties by lowest rank (lazy: live only if it equals `free`).
    room: BinaryHeap<(u64, Reverse<u32>)>,
    free: Vec<u64>,
    a: Assignment,
    skipped: Vec<u32>,
    /// Ranks with less free room than this can take no further whole block.
    floor: u64,
    /// [`Options::comm_aware`], and the means it normalises by.
    comm_aware: bool,
    mean_load: f64,
    mean_comm: f64,
    /// [`Options::affinity`], and the home of the unit being placed.
    affinity: f64,
    home: Option<u32>,
    /// The fill rule ([`Options::fill`]), the weight still to place after the unit being
    /// placed, and the free room of all ranks together.
    fill: bool,
    weight_left: f64,
    free_total: u64,
}

impl State {
    fn give(&mut self, r: u32, chunks: &[TokenRange], weight: f64) {
        let r_us = r as usize;
        let tokens: u64 = chunks.iter().map(TokenRange::len).sum();
        self.a.loads[r_us] += weight;
        self.a.tokens[r_us] += tokens;
        self.free[r_us] -= tokens;
        self.free_total -= tokens;
        if self.free[r_us] > 0 {
            self.room.push((self.free[r_us], Reverse(r)));
        }
    }

    /// (Re)insert rank `r` in the load heap with its current load, unless it is too full to
    /// take any further whole block (then only `cut` can still use its room).
    fn requeue(&mut self, r: u32) {
        let free = self.free[r as usize];
        self.version[r as usize] += 1;
        if free > 0 && free >= self.floor {
            let key = Key(self.a.loads[r as usize], r, self.version[r as usize]);
            self.heaps[class(free)].push(Reverse(key));
        }
    }

    /// Largest free room of any rank, and that rank (lowest id on ties).
    fn max_room(&mut self) -> Option<(u64, u32)> {
        while let Some(&(f, Reverse(r))) = self.room.peek() {
            if self.free[r as usize] == f {
                return Some((f, r));
            }
            self.room.pop();
        }
        None
    }

    /// The comm-aware choice for a unit of `weight` and `comm` ([`Options::comm_aware`]): one
    /// scan of the ranks with room, O(N) — only units of long documents take it.
    fn comm_aware_rank(&self, tokens: u64, weight: f64, comm: f64) -> Option<u32> {
        self.best_rank(tokens, weight, |r, load| {
            (load / self.mean_load).max((self.a.comm[r] + comm) / self.mean_comm)
        })
    }

    /// The fill rule's choice for a unit of `tokens` and `weight` ([`Options::fill`]): one
    /// scan of the ranks with room, O(N).
    fn fill_rank(&self, tokens: u64, weight: f64) -> Option<u32> {
        let room_after = self.free_total.saturating_sub(tokens);
        let density = if room_after > 0 {
            self.weight_left / room_after as f64
        } else {
            0.0
        };
        self.best_rank(tokens, weight, |r, load| {
            load + (self.free[r] - tokens) as f64 * density
        })
    }

    /// The rank with room for `tokens` whose `score(rank, load after taking weight)` is least
    /// (ties: less load, then lower id).
    fn best_rank(
        &self,
        tokens: u64,
        weight: f64,
        score: impl Fn(usize, f64) -> f64,
    ) -> Option<u32> {
        let mut best: Option<(f64, f64, u32)> = None;
        for (r, &free) in self.free.iter().enumerate() {
            if free < tokens {
                continue;
            }
            let load = self.a.loads[r] + weight;
            let score = score(r, load);
            if best.is_none_or(|(s, l, _)| score < s || (score == s && load < l)) {
                best = Some((score, load, r as u32));
            }
        }
        best.map(|b| b.2)
    }

    /// Least-loaded rank with room for `tokens` (or, for a unit that moves K/V under
    /// [`Options::comm_aware`], the rank [`State::comm_aware_rank`] picks); false (and nothing
    /// changed) if no rank has room.
    fn place_whole(&mut self, blocks: &[Block], tokens: u64, weight: f64, comm: f64) -> bool {
        if self.max_room().is_none_or(|(f, _)| f < tokens) {
            return false;
        }
        if self.comm_aware && comm > 0.0 {
            let Some(r) = self.comm_aware_rank(tokens, weight, comm) else {
                return false;
            };
            // The rank's heap entry goes stale with the version bump in `requeue`.
            self.commit(r, blocks, weight, comm);
            return true;
        }
        if self.fill {
            let Some(r) = self.fill_rank(tokens, weight) else {
                return false;
            };
            self.commit(r, blocks, weight, comm);
            return true;
        }
        let c = class(tokens.max(1));
        // Least-loaded live rank of each class above `c`: all of them have room.
        let mut best: Option<Key> = None;
        for h in c + 1..self.heaps.len() {
            while let Some(&Reverse(k)) = self.heaps[h].peek() {
                if k.2 == self.version[k.1 as usize] {
                    best = Some(best.map_or(k, |b| b.min(k)));
                    break;
                }
                self.heaps[h].pop();
            }
        }
        // In class `c` itself, skip ranks without room, stopping once past `best`.
        let mut found: Option<Key> = None;
        while let Some(Reverse(k)) = self.heaps[c].pop() {
            if k.2 != self.version[k.1 as usize] {
                continue; // stale entry
            }
            if best.is_some_and(|b| b < k) {
                self.heaps[c].push(Reverse(k));
                break;
            }
            if self.free[k.1 as usize] >= tokens {
                found = Some(k);
                break;
            }
            self.skipped.push(k.1);
        }
        let skipped = std::mem::take(&mut self.skipped);
        for r in skipped {
            self.requeue(r);
        }
        let r = match (found, best) {
            (Some(k), _) => k.1,
            (None, Some(b)) => b.1,
            (None, None) => return false,
        };
        // A chosen `best` is still in its heap: `requeue` bumps the version, retiring it.
        self.commit(r, blocks, weight, comm);
        true
    }

    fn commit(&mut self, r: u32, blocks: &[Block], weight: f64, comm: f64) {
        let r = self.prefer_home(r, blocks, weight, comm);
        for b in blocks {
            self.give(r, &b.chunks, 0.0);
        }
        self.a.items.push(Item {
            chunks: blocks
                .iter()
                .flat_map(|b| b.chunks.iter().copied())
                .collect(),
            weight,
        });
        self.a.item_rank.push(r);
        self.a.loads[r as usize] += weight;
        self.a.comm[r as usize] += comm;
        self.requeue(r);
    }

    /// The unit's home instead of `r` when affinity allows it ([`Options::affinity`]).
    fn prefer_home(&self, r: u32, blocks: &[Block], weight: f64, comm: f64) -> u32 {
        let Some(h) = self.home.filter(|&h| h != r && self.affinity > 0.0) else {
            return r;
        };
        let (hu, ru) = (h as usize, r as usize);
        let tokens: u64 = blocks.iter().map(Block::tokens).sum();
        let eps = self.affinity * self.mean_load;
        let load_ok = self.a.loads[hu] + weight <= self.a.loads[ru] + weight + eps;
        let comm_ok = !self.comm_aware
            || comm == 0.0
            || (self.a.comm[hu] - self.a.comm[ru]) / self.mean_comm <= self.affinity;
        if self.free[hu] >= tokens && load_ok && comm_ok {
            h
        } else {
            r
        }
    }

    /// Cut block `b` across the ranks with the most free room (largest first, ties by id).
    fn cut(&mut self, b: &Block, weight: f64) {
        let total = b.tokens().max(1);
        let mut rest: Vec<TokenRange> = b.chunks.clone();
        rest.reverse(); // pop from the front of the block
        while !rest.is_empty() {
            let (room, r) = self
                .max_room()
                .expect("cap × ranks below the batch's tokens");
            let mine = take_front(&mut rest, room);
            let tokens: u64 = mine.iter().map(TokenRange::len).sum();
            let w = weight * tokens as f64 / total as f64;
            self.give(r, &mine, w);
            self.a.items.push(Item {
                chunks: mine,
                weight: w,
            });
            self.a.item_rank.push(r);
            self.requeue(r);
        }
    }
}

/// Up to `room` tokens taken off the front of `rest` (chunks in reverse order: the front is
/// last), the chunk at the boundary cut in two: how a block is cut across ranks (or nodes)
/// with room.
pub(super) fn take_front(rest: &mut Vec<TokenRange>, mut room: u64) -> Vec<TokenRange> {
    let mut mine = Vec::new();
    while room > 0 {
        let Some(c) = rest.pop() else { break };
        if c.len() <= room {
            room -= c.len();
            mine.push(c);
        } else {
            mine.push(TokenRange::new(c.doc, c.start, c.start + room));
            rest.push(TokenRange::new(c.doc, c.start + room, c.end));
            room = 0;
        }
    }
    mine
}

/// Room class of `free` tokens: ⌊log2 free⌋ (`free` ≥ 1).
fn class(free: u64) -> usize {
    63 - free.leading_zeros() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(doc: u32, len: u64, weight: f64) -> Unit {
        Unit {
            blocks: vec![Block {
                chunks: vec![TokenRange::new(doc, 0, len)],
                packed: true,
            }],
            weight,
            comm: 0.0,
            home: None,
            origin: doc,
        }
    }

    #[test]
    fn heaviest_first_to_least_loaded_with_id_ties() {
        // Weights 3, 5, 1, 4, 3 (by unit index) on 2 ranks.
        let units = vec![
            unit(0, 1, 3.0),
            unit(1, 1, 5.0),
            unit(2, 1, 1.0),
            unit(3, 1, 4.0),
            unit(4, 1, 3.0),
        ];
        let a = assign(&units, 2, 100);
        // Order: doc1 (5), doc3 (4), doc0 (3, lower index), doc4 (3), doc2 (1).
        // doc1→r0 (0,0 tie → id 0); doc3→r1; doc0→r1 (4<5); doc4→r0 (5<7); doc2→r1 (7<8).
        let docs = |r: usize| a.owned[r].iter().map(|c| c.doc).collect::<Vec<_>>();
        assert_eq!(docs(0), vec![1, 4]);
        assert_eq!(docs(1), vec![3, 0, 2]);
        assert_eq!(a.loads, vec![8.0, 8.0]);
    }

    #[test]
    fn full_rank_is_skipped_for_next_least_loaded() {
        // Cap 10: the 10-token unit fills rank 1, so the last unit goes to rank 0 although
        // rank 1 is less loaded.
        let units = vec![unit(0, 2, 5.0), unit(1, 10, 1.0), unit(2, 2, 0.5)];
        let a = assign(&units, 2, 10);
        assert_eq!(a.tokens, vec![4, 10]);
        assert_eq!(a.loads, vec![5.5, 1.0]);
        assert_eq!((a.split_pairs, a.split_blocks), (0, 0));
    }

    #[test]
    fn block_that_fits_nowhere_is_cut() {
        // Cap 10 on 2 ranks.
        let units = vec![unit(0, 10, 1.0), unit(1, 4, 5.0), unit(2, 4, 4.0)];
        let a = assign(&units, 2, 10);
        // doc1 (5) → r0; doc2 (4) → r1; doc0 (1, 10 tokens) → r1 has 6 free, r0 has 6 free:
        // neither fits whole → cut.
        assert_eq!(a.split_blocks, 1);
        assert!(a.tokens.iter().all(|&t| t <= 10));
        assert_eq!(a.tokens.iter().sum::<u64>(), 18);
    }

    #[test]
    fn cap_is_strict_and_everything_is_placed() {
        let units: Vec<Unit> = (0..20)
            .map(|i| unit(i, 3 + i as u64 % 4, i as f64))
            .collect();
        let total: u64 = units.iter().map(Unit::tokens).sum();
        let cap = total.div_ceil(3);
        let a = assign(&units, 3, cap);
        assert!(
            a.tokens.iter().all(|&t| t <= cap),
            "{:?} cap {cap}",
            a.tokens
        );
        assert_eq!(a.tokens.iter().sum::<u64>(), total);
    }

    #[test]
    fn fill_rule_leaves_room_for_the_light_units_a_full_budget_needs() {
        // 2 ranks × 6 tokens, 12 tokens to place: every rank ends full. LPT gives the 8 to
        // rank 1 (it is lighter), fills rank 0 with the 7 and must then put the last unit on
        // rank 1: 19 / 24. The fill rule sees that rank 1, with 3 tokens of room left, would
        // end heavier and gives the 8 to rank 0: 20 / 23, the best any placement can do.
        let units = vec![
            unit(0, 2, 10.0),
            unit(1, 3, 12.0),
            unit(2, 3, 8.0),
            unit(3, 3, 7.0),
            unit(4, 1, 6.0),
        ];
        let busiest = |a: &Assignment| a.loads.iter().copied().fold(0.0, f64::max);
        let lpt = assign(&units, 2, 6);
        assert_eq!(busiest(&lpt), 24.0);
        let opts = Options {
            fill: true,
            ..Options::default()
        };
        let fill = assign_with(&units, 2, 6, opts);
        assert_eq!(busiest(&fill), 23.0);
        assert_eq!(fill.tokens, vec![6, 6]);
    }

    #[test]
    fn fill_never_leaves_the_busiest_rank_heavier_than_lpt() {
        // The fill rule alone can do worse than LPT (it bets on what is still to come); with
        // `fill` the lighter of the two is kept, so LPT's busiest rank is a bound.
        let units: Vec<Unit> = (0..40)
            .map(|i| unit(i, 1 + (i as u64 * 7) % 9, f64::from((i * 13) % 17 + 1)))
            .collect();
        let total: u64 = units.iter().map(Unit::tokens).sum();
        for ranks in [2, 3, 5] {
            let cap = total.div_ceil(ranks);
            let busiest = |a: &Assignment| a.loads.iter().copied().fold(0.0, f64::max);
            let lpt = assign(&units, ranks as u32, cap);
            let opts = Options {
                fill: true,
                ..Options::default()
            };
            let fill = assign_with(&units, ranks as u32, cap, opts);
            assert!(busiest(&fill) <= busiest(&lpt));
            assert!(fill.tokens.iter().all(|&t| t <= cap));
            assert_eq!(fill.tokens.iter().sum::<u64>(), total);
        }
    }
}
