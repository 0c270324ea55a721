//! Indexes over a plan that the simulator queries once per transfer: which steps of a rank read
//! a range, and whether a rank owns a range. Built once per plan so a query costs a binary
//! search instead of a scan over every task.

use crate::plan::{Delivery, DocRuns, Plan, TokenRange, TransferTensor};

/// Ranges read on one rank, per document: `(start, end, (step, first head, end head))` runs,
/// heads as query heads.
type Runs = DocRuns<(u32, u32, u32)>;

/// Ranges a rank owns, per document.
type Held = DocRuns<u32>;

/// Per rank and document: the query ranges and key/value ranges its tasks read, with their
/// steps, and the ranges it owns.
pub struct PlanIndex {
    q: Vec<Runs>,
    kv: Vec<Runs>,
    owned: Vec<Held>,
    /// [`PlanIndex::use_steps`] of each delivery.
    uses: Vec<Option<(u32, u32)>>,
    /// Per transfer: whether it forwards received data ([`crate::plan::forwarding`]), worked
    /// out once per plan for both passes.
    forwards: Vec<bool>,
}

impl PlanIndex {
    /// Index `plan`.
    pub fn new(plan: &Plan) -> Self {
        let (mut q, mut kv, mut owned) = (Vec::new(), Vec::new(), Vec::new());
        for rp in &plan.ranks {
            let (mut rq, mut rkv) = (Vec::new(), Vec::new());
            for (s, st) in rp.steps.iter().enumerate() {
                for t in &st.tasks {
                    let (first, end) = heads(t.heads, plan.q_heads);
                    let read = (s as u32, first, end);
                    rq.push((t.q.doc, t.q.start, t.q.end, read));
                    rkv.push((t.kv.doc, t.kv.start, t.kv.end, read));
                }
            }
            q.push(DocRuns::new(rq));
            kv.push(DocRuns::new(rkv));
            owned.push(DocRuns::new(
                rp.owned
                    .iter()
                    .map(|o| (o.doc, o.start, o.end, 0))
                    .collect(),
            ));
        }
        let mut idx = PlanIndex {
            q,
            kv,
            owned,
            uses: Vec::new(),
            forwards: crate::plan::forwarding(plan),
        };
        idx.uses = idx.transfer_use_steps(plan);
        idx
    }

    /// First and last step that reads what delivery `d` of the plan ([`Plan::deliveries`]
    /// order) carries: for Q and K/V, the receiver's steps whose tasks read it (as queries for
    /// Q); for an output return, the sender's steps that compute those queries; tasks on heads
    /// the delivery does not carry do not read it (bug hunt: a K/V all-gather in head slices,
    /// one per step, kept every slice live to the last step, double-counting memory). `None`
    /// when no task reads it.
    pub fn use_steps(&self, d: usize) -> Option<(u32, u32)> {
        self.uses[d]
    }

    /// [`PlanIndex::use_steps`] of every delivery of `plan`, in its order.
    ///
    /// Asked transfer by transfer, each range looks up another document's runs, out of cache:
    /// a 64-rank zigzag plan has 3.6 million ranges and spent 4 of its 21 s of `simulate` there.
    /// Here the ranges are answered one reading rank at a time, sorted by document.
    fn transfer_use_steps(&self, plan: &Plan) -> Vec<Option<(u32, u32)>> {
        let deliveries: Vec<Delivery<'_>> = plan.deliveries().collect();
        let mut spans = vec![None; deliveries.len()];
        // The deliveries each rank reads, and what its tasks read them as.
        let mut by_reader: Vec<Vec<usize>> = vec![Vec::new(); self.q.len()];
        for (d, dl) in deliveries.iter().enumerate() {
            if let Some(b) = by_reader.get_mut(reader(dl).0 as usize) {
                b.push(d);
            }
        }
        // Per reading rank: (doc, read as, start, end, delivery).
        let mut asks: Vec<(u32, TransferTensor, u64, u64, usize)> = Vec::new();
        for (rank, reads) in by_reader.iter().enumerate() {
            asks.clear();
            for &d in reads {
                let dl = &deliveries[d];
                let read_as = reader(dl).1;
                asks.extend(
                    dl.transfer
                        .ranges
                        .iter()
                        .map(|r| (r.doc, read_as, r.start, r.end, d)),
                );
            }
            // Grouped by (doc, read as) only: within a group the order does not matter, as
            // spans widen by min and max (sorting whole tuples was a fifth of simulating
            // per-doc CP at 256 ranks, 130 million delivered ranges).
            asks.sort_unstable_by_key(|a| ((a.0 as u64) << 2) | a.1 as u64);
            for chunk in asks.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
                let (doc, read_as) = (chunk[0].0, chunk[0].1);
                let Some(runs) = self.reads(rank as u32, read_as).get(doc) else {
                    continue;
                };
                for &(_, _, start, end, d) in chunk {
                    let (lo, hi) = heads(deliveries[d].transfer.heads, plan.q_heads);
                    widen(
                        &mut spans[d],
                        runs.overlapping(start, end)
                            .filter(|r| r.2 .1 < hi && lo < r.2 .2),
                    );
                }
            }
        }
        spans
    }

    fn reads(&self, rank: u32, tensor: TransferTensor) -> &Runs {
        if tensor == TransferTensor::Q {
            &self.q[rank as usize]
        } else {
            &self.kv[rank as usize]
        }
    }

    /// Per transfer of the plan, in order: whether it forwards data its source received.
    pub fn forwards(&self) -> &[bool] {
        &self.forwards
    }

    /// Whether `rank` owns every token of `ranges` (in the planned layout).
    pub fn owns_all(&self, rank: u32, ranges: &[TokenRange]) -> bool {
        covers_all(&self.owned[rank as usize], ranges)
    }
}

/// The rank whose tasks read what `d` carries, and what they read it as: Q and K/V are read
/// by their receiver, an output return's queries by its sender.
fn reader(d: &Delivery<'_>) -> (u32, TransferTensor) {
    match d.transfer.tensor {
        TransferTensor::Out => (d.transfer.src, TransferTensor::Q),
        tensor => (d.dst, tensor),
    }
}

/// Query heads `[first, end)` of an optional head range (none: all `q_heads`).
fn heads(h: Option<crate::plan::HeadRange>, q_heads: u32) -> (u32, u32) {
    h.map_or((0, q_heads), |h| (h.start, h.end))
}

/// Widen `span` to the steps of `runs`.
fn widen<'a>(
    span: &mut Option<(u32, u32)>,
    runs: impl Iterator<Item = &'a (u64, u64, (u32, u32, u32))>,
) {
    for &(_, _, (s, _, _)) in runs {
        *span = Some(span.map_or((s, s), |(a, b)| (a.min(s), b.max(s))));
    }
}

fn covers_all(map: &Held, ranges: &[TokenRange]) -> bool {
    ranges.iter().all(|r| {
        map.get(r.doc)
            .is_some_and(|runs| runs.covers(r.start, r.end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::planner_for;
    use crate::planners::testing::with_ctx;
    use crate::trace::Batch;

    /// Every scheme's transfers of Q, K/V and outputs (ulysses and hybrid have all three; fcp
    /// reshuffled returns outputs to the input owner; per-doc's all-gather reaches several
    /// receivers per transfer): the batched use steps of each delivery equal a scan of every
    /// task of the reading rank.
    #[test]
    fn index_agrees_with_a_scan() {
        let mut seen = std::collections::BTreeSet::new();
        let mut multicast = false;
        for scheme in [
            "zigzag",
            "ulysses",
            "hybrid",
            "fcp:reshuffle=true,solver=false",
            "per-doc",
            "llama3-contig",
        ] {
            let planner = planner_for(scheme).unwrap();
            let plan = with_ctx(4, Mask::Causal, |c| {
                planner.plan(&Batch::new(0, vec![100, 7, 33, 900]), c)
            })
            .unwrap();
            let idx = PlanIndex::new(&plan);
            seen.extend(plan.transfers.iter().map(|t| format!("{:?}", t.tensor)));
            multicast |= plan.delivery_count() > plan.transfers.len();
            for (i, d) in plan.deliveries().enumerate() {
                let t = d.transfer;
                let (rank, as_q) = match t.tensor {
                    TransferTensor::Out => (t.src, true),
                    tensor => (d.dst, tensor == TransferTensor::Q),
                };
                let mut scan: Option<(u32, u32)> = None;
                for (s, st) in plan.ranks[rank as usize].steps.iter().enumerate() {
                    let (lo, hi) = heads(t.heads, plan.q_heads);
                    let reads = |x: &crate::plan::Task| {
                        let read = if as_q { x.q } else { x.kv };
                        let (a, b) = heads(x.heads, plan.q_heads);
                        a < hi
                            && lo < b
                            && t.ranges.iter().any(|r| {
                                r.doc == read.doc && r.start < read.end && read.start < r.end
                            })
                    };
                    if st.tasks.iter().any(reads) {
                        let s = s as u32;
                        scan = Some(scan.map_or((s, s), |(a, b)| (a.min(s), b.max(s))));
                    }
                }
                assert_eq!(idx.use_steps(i), scan, "{scheme}: transfer {i}");
                if scheme == "zigzag" {
                    assert!(idx.owns_all(t.src, &t.ranges) == (t.arrive_by == 1));
                }
            }
        }
        assert_eq!(
            seen.len(),
            3,
            "the plans carry Q, K/V and outputs: {seen:?}"
        );
        assert!(
            multicast,
            "per-doc's all-gather has transfers with several receivers"
        );
    }
}
