//! Indexes over a plan that the simulator queries once per transfer: which steps of a rank read
//! a range, and whether a rank owns a range. Built once per plan so a query costs a binary
//! search instead of a scan over every task.

use crate::hashing::FastMap;
use crate::plan::{Plan, RunIndex, TokenRange, TransferTensor};

/// Ranges read (or owned) on one rank, per document: `(start, end, step)` runs.
type Runs = RunIndex<u32>;

/// Per rank: the runs of each document, gathered before they are indexed.
type Gathered = Vec<FastMap<u32, Vec<(u64, u64, u32)>>>;

fn index(gathered: Gathered) -> Vec<FastMap<u32, Runs>> {
    gathered
        .into_iter()
        .map(|m| m.into_iter().map(|(d, r)| (d, RunIndex::new(r))).collect())
        .collect()
}

/// Per rank and document: the query ranges and key/value ranges its tasks read, with their
/// steps, and the ranges it owns.
pub struct PlanIndex {
    q: Vec<FastMap<u32, Runs>>,
    kv: Vec<FastMap<u32, Runs>>,
    owned: Vec<FastMap<u32, Runs>>,
    /// What each rank holds before any transfer: its input layout, or `owned` without one.
    initial: Option<Vec<FastMap<u32, Runs>>>,
}

impl PlanIndex {
    /// Index `plan`.
    pub fn new(plan: &Plan) -> Self {
        let n = plan.ranks.len();
        let empty = || -> Gathered { (0..n).map(|_| FastMap::default()).collect() };
        let (mut q, mut kv, mut owned) = (empty(), empty(), empty());
        for (r, rp) in plan.ranks.iter().enumerate() {
            for (s, st) in rp.steps.iter().enumerate() {
                for t in &st.tasks {
                    q[r].entry(t.q.doc)
                        .or_default()
                        .push((t.q.start, t.q.end, s as u32));
                    kv[r]
                        .entry(t.kv.doc)
                        .or_default()
                        .push((t.kv.start, t.kv.end, s as u32));
                }
            }
            for o in &rp.owned {
                owned[r].entry(o.doc).or_default().push((o.start, o.end, 0));
            }
        }
        let initial = plan.input_layout.as_ref().map(|layout| {
            let mut m = empty();
            for (r, ranges) in layout.iter().enumerate().take(n) {
                for o in ranges {
                    m[r].entry(o.doc).or_default().push((o.start, o.end, 0));
                }
            }
            index(m)
        });
        PlanIndex {
            q: index(q),
            kv: index(kv),
            owned: index(owned),
            initial,
        }
    }

    /// First and last step on `rank` whose tasks read any of `ranges` as queries (`Q`) or as
    /// keys/values (otherwise).
    pub fn use_steps(
        &self,
        rank: u32,
        ranges: &[TokenRange],
        tensor: TransferTensor,
    ) -> Option<(u32, u32)> {
        let map = if tensor == TransferTensor::Q {
            &self.q[rank as usize]
        } else {
            &self.kv[rank as usize]
        };
        let mut span: Option<(u32, u32)> = None;
        for r in ranges {
            if let Some(runs) = map.get(&r.doc) {
                for &(_, _, s) in runs.overlapping(r.start, r.end) {
                    span = Some(span.map_or((s, s), |(a, b)| (a.min(s), b.max(s))));
                }
            }
        }
        span
    }

    /// Whether `rank` owns every token of `ranges` (in the planned layout).
    pub fn owns_all(&self, rank: u32, ranges: &[TokenRange]) -> bool {
        covers_all(&self.owned[rank as usize], ranges)
    }

    /// Whether `rank` holds every token of `ranges` before any transfer (its input layout, or
    /// what it owns when the plan has none): a message of such data leaves as soon as the rank
    /// is ready, anything else waits for the data to arrive.
    pub fn holds_initially(&self, rank: u32, ranges: &[TokenRange]) -> bool {
        match &self.initial {
            Some(m) => covers_all(&m[rank as usize], ranges),
            None => self.owns_all(rank, ranges),
        }
    }
}

fn covers_all(map: &FastMap<u32, Runs>, ranges: &[TokenRange]) -> bool {
    ranges.iter().all(|r| {
        map.get(&r.doc)
            .is_some_and(|runs| runs.covers(r.start, r.end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::testing::with_ctx;
    use crate::planners::{Planner, Zigzag};
    use crate::trace::Batch;

    #[test]
    fn index_agrees_with_a_scan() {
        let plan = with_ctx(4, Mask::Causal, |c| {
            Zigzag.plan(&Batch::new(0, vec![100, 7, 33]), c)
        })
        .unwrap();
        let idx = PlanIndex::new(&plan);
        for t in &plan.transfers {
            let mut scan: Option<(u32, u32)> = None;
            for (s, st) in plan.ranks[t.dst as usize].steps.iter().enumerate() {
                if st.tasks.iter().any(|x| {
                    t.ranges
                        .iter()
                        .any(|r| r.doc == x.kv.doc && r.start < x.kv.end && x.kv.start < r.end)
                }) {
                    let s = s as u32;
                    scan = Some(scan.map_or((s, s), |(a, b)| (a.min(s), b.max(s))));
                }
            }
            assert_eq!(idx.use_steps(t.dst, &t.ranges, t.tensor), scan);
            assert!(idx.owns_all(t.src, &t.ranges) == (t.arrive_by == 1));
        }
    }
}
