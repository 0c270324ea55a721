//! Compute rebalance: a local search that evens out compute across ranks after LPT, under the
//! token cap.
//!
//! Why: when a batch is packed to its budget the cap binds — every rank must hold almost
//! exactly its share of tokens — and LPT, which places the heaviest unit first on the
//! least-loaded rank *with room*, ends with the last ranks taking whatever still fits, heavy or
//! light. On prolong at 16 ranks (B200, 99.8% of the budget filled) LPT left one rank at 55% of
//! the busiest one's compute. Exchanges fix much of it: a late block of a long document (heavy
//! per token) for an early block or a short document of the same size (light per token).
//!
//! Each step takes the busiest rank and, against each of the [`Options::partners`]
//! least-loaded ranks, every one of its items: moved there (if it has room), or swapped for a
//! lighter item of that rank (if both stay within the cap). The exchange leaving the lowest
//! maximum of the two ranks is applied when that maximum is below the busiest rank's load. The
//! sorted vector of loads falls lexicographically at every step, so the search ends; it is also
//! capped at [`Options::max_steps`]. Ties go to the first found (partners by load, items in
//! rank order), so results are deterministic.
//!
//! Cutting pieces off blocks to make the token sizes match was tried and dropped: it balanced
//! the planner's weights but added tiles and traffic that cost more than they saved
//! (`docs/schemes/hybrid.md`).
//!
//! Cost per step: O(I_h · P · I_l) for I items on a rank and P partners.

use super::repair::Item;

/// Knobs of the search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Step limit (applied moves and swaps).
    pub max_steps: usize,
    /// Least-loaded ranks tried as partners per step.
    pub partners: usize,
    /// Stop once the busiest rank is within this factor of the mean load.
    pub target: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_steps: 0,
            partners: 16,
            target: 1.005,
        }
    }
}

/// What the search did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Outcome {
    /// Moves and swaps applied.
    pub steps: usize,
    /// Busiest rank's load over the mean, before and after.
    pub before: f64,
    /// See `before`.
    pub after: f64,
}

/// One exchange between the busiest rank and a partner: the item the busiest rank gives, and
/// the item it takes back (a swap) or none (a move); `peak` is the larger of the two ranks'
/// loads after it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Exchange {
    peak: f64,
    partner: usize,
    give: usize,
    take: Option<usize>,
}

/// Every rank's items, load and tokens.
struct Ranks {
    on: Vec<Vec<usize>>,
    load: Vec<f64>,
    tokens: Vec<u64>,
}

impl Ranks {
    /// Move item `i` from rank `from` to rank `to`.
    fn hand(&mut self, items: &[Item], rank: &mut [u32], i: usize, from: usize, to: usize) {
        self.on[from].retain(|&x| x != i);
        self.on[to].push(i);
        rank[i] = to as u32;
        self.load[from] -= items[i].weight;
        self.load[to] += items[i].weight;
        self.tokens[from] -= items[i].tokens();
        self.tokens[to] += items[i].tokens();
    }
}

/// Rebalance compute: move or swap `items` (placed on `rank`, `ranks` ranks) so that the
/// busiest rank's weight falls, keeping every rank within `cap` tokens (a rank already above
/// it is never given more).
pub fn rebalance(items: &[Item], rank: &mut [u32], ranks: u32, cap: u64, opts: Options) -> Outcome {
    let n = ranks as usize;
    let mut st = Ranks {
        on: vec![Vec::new(); n],
        load: vec![0.0f64; n],
        tokens: vec![0u64; n],
    };
    for (i, it) in items.iter().enumerate() {
        let r = rank[i] as usize;
        st.on[r].push(i);
        st.load[r] += it.weight;
        st.tokens[r] += it.tokens();
    }
    let mean = st.load.iter().sum::<f64>() / n.max(1) as f64;
    let peak_of = |load: &[f64]| load.iter().copied().fold(0.0, f64::max);
    let ratio = |x: f64| if mean > 0.0 { x / mean } else { 1.0 };
    let mut out = Outcome {
        before: ratio(peak_of(&st.load)),
        ..Outcome::default()
    };
    let mut by_load: Vec<usize> = (0..n).collect();
    while out.steps < opts.max_steps && n > 1 {
        by_load.sort_by(|&a, &b| st.load[a].total_cmp(&st.load[b]).then(a.cmp(&b)));
        let h = by_load[n - 1];
        if st.load[h] <= opts.target * mean {
            break;
        }
        let Some(e) = best_exchange(items, &st, &by_load, cap, opts.partners) else {
            break;
        };
        st.hand(items, rank, e.give, h, e.partner);
        if let Some(take) = e.take {
            st.hand(items, rank, take, e.partner, h);
        }
        out.steps += 1;
    }
    out.after = ratio(peak_of(&st.load));
    out
}

/// The exchange between the busiest rank (`by_load`'s last) and one of the `partners`
/// least-loaded ranks that leaves the lowest maximum of the two, if below the busiest rank's
/// load; ties go to the first found (partners by load, items in rank order).
fn best_exchange(
    items: &[Item],
    st: &Ranks,
    by_load: &[usize],
    cap: u64,
    partners: usize,
) -> Option<Exchange> {
    let n = by_load.len();
    let h = by_load[n - 1];
    let (load, tokens) = (&st.load, &st.tokens);
    // Room left on a rank; one above the cap keeps what it has (it never grows).
    let room = |r: usize| cap.saturating_sub(tokens[r]);
    let mut best: Option<Exchange> = None;
    for &l in by_load.iter().take(partners.min(n - 1)) {
        // No exchange with this partner, or a later (more loaded) one, beats the midpoint.
        if best.is_some_and(|b| b.peak <= (load[h] + load[l]) / 2.0) {
            break;
        }
        for &a in &st.on[h] {
            let (wa, ta) = (items[a].weight, items[a].tokens());
            if wa <= 0.0 {
                continue;
            }
            let mut consider = |take: Option<usize>, wb: f64| {
                let peak = (load[h] - wa + wb).max(load[l] + wa - wb);
                if peak < load[h] && best.is_none_or(|b| peak < b.peak) {
                    best = Some(Exchange {
                        peak,
                        partner: l,
                        give: a,
                        take,
                    });
                }
            };
            if ta <= room(l) {
                consider(None, 0.0);
            }
            for &b in &st.on[l] {
                let (wb, tb) = (items[b].weight, items[b].tokens());
                if wb < wa && tb <= ta + room(h) && ta <= tb + room(l) {
                    consider(Some(b), wb);
                }
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::TokenRange;
    use proptest::prelude::*;

    fn item(doc: u32, len: u64, weight: f64) -> Item {
        Item {
            chunks: vec![TokenRange::new(doc, 0, len)],
            weight,
        }
    }

    fn run(items: &[Item], rank: &mut [u32], ranks: u32, cap: u64) -> Outcome {
        let opts = Options {
            max_steps: 100,
            ..Options::default()
        };
        rebalance(items, rank, ranks, cap, opts)
    }

    #[test]
    fn a_swap_of_equal_sizes_balances_a_full_cap() {
        // Both ranks are full (cap 2 × 100 tokens): no move fits, one swap balances.
        let items = vec![
            item(0, 100, 9.0),
            item(1, 100, 9.0),
            item(2, 100, 1.0),
            item(3, 100, 1.0),
        ];
        let mut rank = vec![0, 0, 1, 1];
        let out = run(&items, &mut rank, 2, 200);
        assert_eq!(out.steps, 1);
        assert!((out.before - 1.8).abs() < 1e-12 && (out.after - 1.0).abs() < 1e-12);
        assert_eq!(rank.iter().filter(|&&r| r == 0).count(), 2);
    }

    #[test]
    fn a_move_fills_free_room() {
        // Rank 1 has room: one of rank 0's items moves there (either leaves a peak of 6; the
        // first found goes).
        let items = vec![item(0, 50, 6.0), item(1, 50, 4.0)];
        let mut rank = vec![0, 0];
        let out = run(&items, &mut rank, 2, 100);
        assert_eq!(out.steps, 1);
        assert_eq!(rank, vec![1, 0]);
        assert!((out.after - 1.2).abs() < 1e-12);
    }

    #[test]
    fn nothing_moves_when_the_cap_forbids_it() {
        // Rank 1 is full and holds nothing lighter than rank 0's only item of its size.
        let items = vec![item(0, 100, 5.0), item(1, 100, 1.0), item(2, 50, 0.5)];
        let mut rank = vec![0, 1, 1];
        let out = run(&items, &mut rank, 2, 150);
        assert_eq!(out.steps, 0);
        assert_eq!(rank, vec![0, 1, 1]);
    }

    proptest! {
        #[test]
        fn rebalance_never_raises_the_peak_and_keeps_the_cap(
            parts in prop::collection::vec((1u64..400, 0.0f64..10.0), 2..40),
            ranks in 2u32..9,
            slack in 0u64..200,
        ) {
            let items: Vec<Item> = parts
                .iter()
                .enumerate()
                .map(|(d, &(len, w))| item(d as u32, len, w))
                .collect();
            let total: u64 = items.iter().map(Item::tokens).sum();
            let longest = items.iter().map(Item::tokens).max().unwrap();
            let cap = (total.div_ceil(u64::from(ranks)) + slack).max(longest);
            // First fit by tokens (any placement within the cap).
            let mut used = vec![0u64; ranks as usize];
            let mut rank = Vec::new();
            for it in &items {
                let r = (0..ranks as usize)
                    .find(|&r| used[r] + it.tokens() <= cap)
                    .unwrap_or_else(|| (0..ranks as usize).min_by_key(|&r| used[r]).unwrap());
                used[r] += it.tokens();
                rank.push(r as u32);
            }
            let out = run(&items, &mut rank, ranks, cap);
            prop_assert!(out.after <= out.before + 1e-12);
            let mut after = vec![0u64; ranks as usize];
            for (it, &r) in items.iter().zip(&rank) {
                after[r as usize] += it.tokens();
            }
            for r in 0..ranks as usize {
                prop_assert!(after[r] <= cap.max(used[r]));
            }
        }
    }
}
