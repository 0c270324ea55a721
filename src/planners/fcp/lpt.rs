//! FCP's block distributor, assignment half (§4.1): LPT under a strict per-rank token cap.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::blocks::{Block, Unit};
use crate::plan::TokenRange;

/// A rank's load as a heap key: f64 seconds ordered totally, ties by rank id.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key(f64, u32);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
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
    /// Pairs that had to be placed as two separate blocks because no rank could hold both.
    pub split_pairs: usize,
    /// Blocks that had to be cut across ranks because no rank could hold them whole.
    pub split_blocks: usize,
}

/// LPT: units by weight, heaviest first (ties by unit index), each to the least-loaded rank
/// (ties by rank id) that still has room for it under `cap` tokens. O(K log N) for K units and
/// N ranks while the least-loaded rank has room; ranks that are full are dropped from the heap.
///
/// When no rank has room for a unit whole, a pair is placed as two blocks, and a block that
/// still fits nowhere is cut across the ranks with the most free room (largest first, ties by
/// load then id). This only happens at the cap's margin, and it makes the cap strict without
/// ever failing: callers ensure `ranks × cap ≥` the batch's tokens.
pub fn assign(units: &[Unit], ranks: u32, cap: u64) -> Assignment {
    let n = ranks as usize;
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|&a, &b| units[b].weight.total_cmp(&units[a].weight).then(a.cmp(&b)));
    // Smallest block still to come: a rank with less room can never take a whole block
    // again and leaves the heap for good (room only shrinks, this floor only grows).
    let mut min_after = vec![u64::MAX; order.len() + 1];
    for i in (0..order.len()).rev() {
        let smallest = units[order[i]].blocks.iter().map(Block::tokens).min();
        min_after[i] = min_after[i + 1].min(smallest.unwrap_or(0));
    }
    let mut st = State {
        heap: (0..ranks).map(|r| Reverse(Key(0.0, r))).collect(),
        free: vec![cap; n],
        a: Assignment {
            owned: vec![Vec::new(); n],
            loads: vec![0.0; n],
            tokens: vec![0; n],
            split_pairs: 0,
            split_blocks: 0,
        },
        skipped: Vec::new(),
        floor: 0,
    };
    for (i, &u) in order.iter().enumerate() {
        st.floor = min_after[i];
        let unit = &units[u];
        if st.place_whole(&unit.blocks, unit.tokens(), unit.weight) {
            continue;
        }
        if unit.blocks.len() > 1 {
            st.a.split_pairs += 1;
        }
        // Heavier block first; weights split by tokens (the unit's f is not per block).
        let mut blocks: Vec<&Block> = unit.blocks.iter().collect();
        blocks.sort_by_key(|b| Reverse(b.tokens()));
        for b in blocks {
            let w = unit.weight * b.tokens() as f64 / unit.tokens().max(1) as f64;
            if !st.place_whole(std::slice::from_ref(b), b.tokens(), w) {
                st.a.split_blocks += 1;
                st.cut(b, w);
            }
        }
    }
    st.a
}

struct State {
    heap: BinaryHeap<Reverse<Key>>,
    free: Vec<u64>,
    a: Assignment,
    skipped: Vec<Reverse<Key>>,
    /// Ranks with less free room than this can take no further whole block.
    floor: u64,
}

impl State {
    fn give(&mut self, r: u32, chunks: &[TokenRange], weight: f64) {
        let r_us = r as usize;
        let tokens: u64 = chunks.iter().map(TokenRange::len).sum();
        self.a.owned[r_us].extend_from_slice(chunks);
        self.a.loads[r_us] += weight;
        self.a.tokens[r_us] += tokens;
        self.free[r_us] -= tokens;
    }

    /// Least-loaded rank with room for `tokens`; false (and nothing changed) if none.
    fn place_whole(&mut self, blocks: &[Block], tokens: u64, weight: f64) -> bool {
        let mut placed = false;
        while let Some(Reverse(Key(load, r))) = self.heap.pop() {
            if self.free[r as usize] >= tokens {
                for b in blocks {
                    self.give(r, &b.chunks, 0.0);
                }
                self.a.loads[r as usize] += weight;
                self.requeue(Reverse(Key(load + weight, r)));
                placed = true;
                break;
            }
            self.skipped.push(Reverse(Key(load, r)));
        }
        let skipped = std::mem::take(&mut self.skipped);
        for k in skipped {
            self.requeue(k);
        }
        placed
    }

    fn requeue(&mut self, k: Reverse<Key>) {
        let free = self.free[k.0 .1 as usize];
        // A rank below the floor leaves the heap; `cut` still finds its room by scanning.
        if free > 0 && free >= self.floor {
            self.heap.push(k);
        }
    }

    /// Cut block `b` across the ranks with the most free room.
    fn cut(&mut self, b: &Block, weight: f64) {
        let total = b.tokens().max(1);
        let mut ranks: Vec<u32> = (0..self.free.len() as u32)
            .filter(|&r| self.free[r as usize] > 0)
            .collect();
        ranks.sort_by(|&x, &y| {
            self.free[y as usize]
                .cmp(&self.free[x as usize])
                .then(self.a.loads[x as usize].total_cmp(&self.a.loads[y as usize]))
                .then(x.cmp(&y))
        });
        let mut rest: Vec<TokenRange> = b.chunks.clone();
        rest.reverse(); // pop from the front of the block
        for r in ranks {
            if rest.is_empty() {
                break;
            }
            let mut room = self.free[r as usize];
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
            let tokens: u64 = mine.iter().map(TokenRange::len).sum();
            self.give(r, &mine, weight * tokens as f64 / total as f64);
        }
        assert!(rest.is_empty(), "cap × ranks below the batch's tokens");
        // Rebuild the heap: loads and room changed for several ranks.
        self.heap = (0..self.free.len() as u32)
            .filter(|&r| self.free[r as usize] > 0)
            .map(|r| Reverse(Key(self.a.loads[r as usize], r)))
            .collect();
    }
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
}
