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
        let reach = reach_of(&runs);
        RunIndex { runs, reach }
    }

    /// Every run, sorted by start.
    pub fn runs(&self) -> &[(u64, u64, T)] {
        &self.runs
    }

    /// The runs and their reach, to query.
    pub fn view(&self) -> Runs<'_, T> {
        Runs {
            runs: &self.runs,
            reach: &self.reach,
        }
    }

    /// The runs that share a token with `[start, end)`, in sorted order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &(u64, u64, T)> {
        self.view().overlapping(start, end)
    }
}

/// The running maximum of the ends of `runs`.
fn reach_of<T>(runs: &[(u64, u64, T)]) -> Vec<u64> {
    let mut furthest = 0;
    runs.iter()
        .map(|r| {
            furthest = furthest.max(r.1);
            furthest
        })
        .collect()
}

/// Sorted runs of one document and their reach, borrowed from a [`RunIndex`] or a [`DocRuns`].
#[derive(Debug, Clone, Copy)]
pub struct Runs<'a, T> {
    runs: &'a [(u64, u64, T)],
    reach: &'a [u64],
}

impl<'a, T: Copy> Runs<'a, T> {
    /// The runs that share a token with `[start, end)`, in sorted order.
    pub fn overlapping(self, start: u64, end: u64) -> impl Iterator<Item = &'a (u64, u64, T)> {
        let first = self.reach.partition_point(|&e| e <= start);
        self.runs[first..]
            .iter()
            .take_while(move |r| r.0 < end)
            .filter(move |r| r.1 > start && r.0 < r.1)
    }

    /// Whether the runs cover every token of `[start, end)`.
    pub fn covers(self, start: u64, end: u64) -> bool {
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

/// The runs of every document one rank reads or holds, in one flat table: a [`RunIndex`] per
/// document without a map of small vectors. A plan of 300,000 one-token documents gave each
/// rank 300,000 map entries of two vectors each per table, and the simulator spent more time
/// allocating and freeing them than simulating.
#[derive(Debug, Clone, Default)]
pub struct DocRuns<T> {
    /// Runs grouped by document (ascending), each group sorted.
    runs: Vec<(u64, u64, T)>,
    /// Running maximum of the ends within each document's group.
    reach: Vec<u64>,
    /// The documents present, ascending.
    docs: Vec<u32>,
    /// `runs[bounds[i]..bounds[i + 1]]` are the runs of `docs[i]`.
    bounds: Vec<usize>,
}

impl<T: Copy + Ord> DocRuns<T> {
    /// Index `(doc, start, end, payload)` runs (any order; overlaps allowed).
    pub fn new(mut all: Vec<(u32, u64, u64, T)>) -> Self {
        all.sort_unstable();
        let mut table = DocRuns {
            runs: Vec::with_capacity(all.len()),
            reach: Vec::with_capacity(all.len()),
            docs: Vec::new(),
            bounds: vec![0],
        };
        let mut furthest = 0;
        for (i, &(doc, start, end, payload)) in all.iter().enumerate() {
            if i == 0 || all[i - 1].0 != doc {
                if i > 0 {
                    table.bounds.push(i);
                }
                table.docs.push(doc);
                furthest = 0;
            }
            furthest = furthest.max(end);
            table.runs.push((start, end, payload));
            table.reach.push(furthest);
        }
        if !all.is_empty() {
            table.bounds.push(all.len());
        }
        table
    }

    /// The runs of `doc`, if it has any.
    pub fn get(&self, doc: u32) -> Option<Runs<'_, T>> {
        let i = self.docs.binary_search(&doc).ok()?;
        let (a, b) = (self.bounds[i], self.bounds[i + 1]);
        Some(Runs {
            runs: &self.runs[a..b],
            reach: &self.reach[a..b],
        })
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
                prop_assert_eq!(idx.view().covers(s, e), covered);
            }
        }
    }

    proptest! {
        /// A flat table answers, document by document, what a [`RunIndex`] of that document's
        /// runs answers, and has nothing for a document without runs.
        #[test]
        fn doc_runs_match_an_index_per_document(
            runs in prop::collection::vec((0u32..5, 0u64..60, 0u64..30, 0u32..4), 0..40),
            queries in prop::collection::vec((0u32..6, 0u64..70, 0u64..30), 1..20),
        ) {
            let runs: Vec<(u32, u64, u64, u32)> =
                runs.into_iter().map(|(d, s, l, p)| (d, s, s + l, p)).collect();
            let table = DocRuns::new(runs.clone());
            for (doc, s, l) in queries {
                let e = s + l;
                let mine: Vec<(u64, u64, u32)> = runs
                    .iter()
                    .filter(|r| r.0 == doc)
                    .map(|r| (r.1, r.2, r.3))
                    .collect();
                match table.get(doc) {
                    None => prop_assert!(mine.is_empty()),
                    Some(view) => {
                        let idx = RunIndex::new(mine);
                        let got: Vec<_> = view.overlapping(s, e).copied().collect();
                        let want: Vec<_> = idx.overlapping(s, e).copied().collect();
                        prop_assert_eq!(got, want);
                        prop_assert_eq!(view.covers(s, e), idx.view().covers(s, e));
                    }
                }
            }
        }
    }

    #[test]
    fn a_long_run_before_short_ones_is_still_found() {
        let idx = RunIndex::new(vec![(0, 1000, 0u32), (10, 20, 1), (30, 40, 2)]);
        let hits: Vec<u32> = idx.overlapping(500, 600).map(|r| r.2).collect();
        assert_eq!(hits, vec![0]);
        assert!(idx.view().covers(0, 1000));
        assert!(!idx.view().covers(0, 1001));
    }
}
