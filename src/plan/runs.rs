//! Token runs indexed for overlap queries: the one lookup the verifier and the simulator make
//! for every task and transfer ("which runs of this document on this rank touch `[a, b)`?").
//!
//! Runs are sorted by start, and each position also keeps the furthest end reached by the runs
//! up to it. That reach never decreases, so the first run that can overlap a query is found by
//! binary search even when runs overlap each other or some are long (a K/V range spanning a
//! whole document): bounding the search by the longest run instead turned FlashCP's plans at
//! 256 ranks, whose K/V ranges are whole documents, back into a scan per query.

/// Runs `[start, end)` with a payload (a step, a rank), sorted by `(start, end, payload)`.
#[derive(Debug, Clone, Default)]
pub struct RunIndex<T> {
    runs: Vec<(u64, u64, T)>,
    /// `reach[i]`: the largest end of `runs[..=i]`.
    reach: Vec<u64>,
}

impl<T: Copy + Ord> RunIndex<T> {
    /// Index `runs` (any order; overlaps allowed).
    pub fn new(mut runs: Vec<(u64, u64, T)>) -> Self {
        runs.sort_unstable();
        let mut furthest = 0;
        let reach = runs
            .iter()
            .map(|r| {
                furthest = furthest.max(r.1);
                furthest
            })
            .collect();
        RunIndex { runs, reach }
    }

    /// Every run, sorted by start.
    pub fn runs(&self) -> &[(u64, u64, T)] {
        &self.runs
    }

    /// The runs that share a token with `[start, end)`, in sorted order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &(u64, u64, T)> {
        let first = self.reach.partition_point(|&e| e <= start);
        self.runs[first..]
            .iter()
            .take_while(move |r| r.0 < end)
            .filter(move |r| r.1 > start && r.0 < r.1)
    }

    /// Whether the runs cover every token of `[start, end)`.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        let mut pos = start;
        for &(s, e, _) in self.overlapping(start, end) {
            if s > pos {
                return false;
            }
            pos = pos.max(e);
            if pos >= end {
                return true;
            }
        }
        pos >= end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Overlap and cover answers equal a scan of every run, overlapping and empty runs
        /// included.
        #[test]
        fn queries_match_a_scan(
            runs in prop::collection::vec((0u64..60, 0u64..30, 0u32..4), 0..25),
            queries in prop::collection::vec((0u64..70, 0u64..30), 1..20),
        ) {
            let runs: Vec<(u64, u64, u32)> = runs.into_iter().map(|(s, l, p)| (s, s + l, p)).collect();
            let idx = RunIndex::new(runs.clone());
            let mut sorted = runs.clone();
            sorted.sort_unstable();
            for (s, l) in queries {
                let e = s + l;
                let scan: Vec<_> = sorted
                    .iter()
                    .filter(|r| r.0 < e && r.1 > s && r.0 < r.1)
                    .copied()
                    .collect();
                let got: Vec<_> = idx.overlapping(s, e).copied().collect();
                prop_assert_eq!(&got, &scan);
                let covered = (s..e).all(|x| sorted.iter().any(|r| r.0 <= x && x < r.1));
                prop_assert_eq!(idx.covers(s, e), covered);
            }
        }
    }

    #[test]
    fn a_long_run_before_short_ones_is_still_found() {
        let idx = RunIndex::new(vec![(0, 1000, 0u32), (10, 20, 1), (30, 40, 2)]);
        let hits: Vec<u32> = idx.overlapping(500, 600).map(|r| r.2).collect();
        assert_eq!(hits, vec![0]);
        assert!(idx.covers(0, 1000));
        assert!(!idx.covers(0, 1001));
    }
}
