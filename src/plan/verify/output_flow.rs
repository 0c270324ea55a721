//! Partial outputs move, they are never copied: an `out` transfer hands the rows it carries
//! (with their log-sum-exp) to its receiver, which merges them, and the sender keeps nothing
//! (docs/executor.md). So a rank may hand over only what it holds and has not handed over
//! yet, and every partial output must end on the rank that holds its rows at the end (the
//! input owner of a reshuffled plan, else the owner).
//!
//! The availability check (invariant 7) sees only whether a rank ever held a partial output
//! before sending it. Bug hunts: plans that sent an owner's finished rows away to a rank that
//! kept them, or listed an `out` transfer twice (a reader merging both copies counts those
//! rows twice), passed and failed the replay; plans returning outputs through another rank,
//! or whose input owner computed some of its own rows, were refused and replayed correctly.
//! This follows every partial output through the plan, in each rank's own order of events,
//! and is the one check of where outputs go (invariant 8, and 10's returns).

use std::collections::{BTreeMap, BTreeSet};

use super::{fmt_range, input_owner_map, owner_map, v, Violation, ViolationKind};
use crate::hashing::FastMap;
use crate::plan::{HeadRange, Plan, TokenRange, TransferTensor};

/// Disjoint token intervals `start → end`, adjacent ones merged.
#[derive(Default)]
struct Tokens(BTreeMap<u64, u64>);

impl Tokens {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // Absorb every interval that overlaps or touches `[start, end)`.
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.0.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.0.range(start..=end).next() {
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// The parts of `[start, end)` this set holds, in order.
    fn within(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let first = self
            .0
            .range(..=start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        self.0
            .range(first..end)
            .map(|(&s, &e)| (s.max(start), e.min(end)))
            .filter(|(s, e)| s < e)
            .collect()
    }

    /// Remove `[start, end)`, returning the parts of it this set did not hold.
    fn take(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let held = self.within(start, end);
        let mut gaps = Vec::new();
        let mut pos = start;
        for &(s, e) in &held {
            if s > pos {
                gaps.push((pos, s));
            }
            pos = e;
        }
        if pos < end {
            gaps.push((pos, end));
        }
        if let Some(&(first, _)) = held.first() {
            // Cut the intervals the removed span touches and put back what lies outside it.
            let keys: Vec<u64> = self
                .0
                .range(..end)
                .rev()
                .take_while(|(_, &e)| e > first)
                .map(|(&s, _)| s)
                .collect();
            for s in keys {
                let e = self.0.remove(&s).unwrap_or(s);
                if s < start {
                    self.0.insert(s, start);
                }
                if e > end {
                    self.0.insert(end, e);
                }
            }
        }
        gaps
    }
}

/// One rank's partial outputs of one document and head segment.
#[derive(Default)]
struct Partials {
    /// Held now: computed or received, and not handed over since.
    pending: Tokens,
    /// Ever held, to tell "handed over already" from "never held" (invariant 7's case).
    ever: Tokens,
    /// What arrived so far: `(start, end, transfer)`. A send forwarding rows waits for every
    /// arrival of them due by its step (as the replay does), which is how sends can wait on
    /// each other in a circle.
    arrived: Vec<(u64, u64, usize)>,
}

/// A document and a head segment (an index into the plan's head cuts).
type Key = (u32, usize);

/// What happens to partial outputs on one rank, in its order: `(time, phase, seq, event)`.
/// Outputs computed in step `s` are held from `s + 1`, arrivals from their `arrive_by`, and a
/// send at `issue_at` sees both when they are due by then (phase 0 before phase 1).
type Timed = (u32, u8, usize, Event);

#[derive(Clone, Copy)]
enum Event {
    /// A task's outputs: its queries, for its heads.
    Computed(TokenRange, Option<HeadRange>),
    /// Transfer `i` delivers its outputs.
    Arrived(usize),
    /// Transfer `i` hands its outputs over.
    Sent(usize),
}

pub(super) fn check_output_flow(plan: &Plan, out: &mut Vec<Violation>) {
    use TransferTensor::Out;
    let outs: Vec<usize> = (0..plan.transfers.len())
        .filter(|&i| plan.transfers[i].tensor == Out)
        .collect();
    let final_holder = match plan.input_layout {
        Some(_) => input_owner_map(plan),
        None => owner_map(plan),
    };
    // Documents no output moves in (all of them in ring or zigzag, 3.8 million tasks at 64
    // ranks): every task's rows must be its own rank's at the end.
    let docs: BTreeSet<u32> = outs
        .iter()
        .flat_map(|&i| plan.transfers[i].ranges.iter().map(|r| r.doc))
        .collect();
    for (rank, rp) in plan.ranks.iter().enumerate() {
        let rank = rank as u32;
        for (s, step) in rp.steps.iter().enumerate() {
            for t in step.tasks.iter().filter(|t| !docs.contains(&t.q.doc)) {
                for &(os, oe, holder) in
                    final_holder[t.q.doc as usize].overlapping(t.q.start, t.q.end)
                {
                    let (a, b) = (os.max(t.q.start), oe.min(t.q.end));
                    if a < b && holder != rank {
                        out.push(v(
                            ViolationKind::OutputNotReturned,
                            format!(
                                "rank {rank} step {s}: output of {} is never returned to rank {holder}, which holds those rows at the end",
                                fmt_range(&TokenRange::new(t.q.doc, a, b))
                            ),
                        ));
                    }
                }
            }
        }
    }
    if outs.is_empty() {
        return;
    }
    // Head segments: every head range of a task or output transfer of those documents cuts.
    let mut cuts = BTreeSet::from([0, plan.q_heads]);
    let mut events: Vec<Vec<Timed>> = vec![Vec::new(); plan.ranks.len()];
    let mut seq = 0usize;
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (s, step) in rp.steps.iter().enumerate() {
            for t in step.tasks.iter().filter(|t| docs.contains(&t.q.doc)) {
                cuts.extend(t.heads.iter().flat_map(|h| [h.start, h.end]));
                events[r].push((s as u32 + 1, 0, seq, Event::Computed(t.q, t.heads)));
                seq += 1;
            }
        }
    }
    // A piece of a collective call leaves when its source joins the call (bug hunt: an `out`
    // piece read as leaving at its later `issue_at` carried outputs computed after the call
    // ran, which the replay then found left behind).
    let sent_at = super::availability::send_steps(plan);
    for &i in &outs {
        let t = &plan.transfers[i];
        cuts.extend(t.heads.iter().flat_map(|h| [h.start, h.end]));
        events[t.dst as usize].push((t.arrive_by, 0, seq, Event::Arrived(i)));
        events[t.src as usize].push((sent_at[i], 1, seq, Event::Sent(i)));
        seq += 1;
    }
    let cuts: Vec<u32> = cuts.into_iter().filter(|&c| c <= plan.q_heads).collect();
    // The segments a head range (absent: all heads) spans.
    let segs = |h: Option<HeadRange>| {
        let (lo, hi) = h.map_or((0, plan.q_heads), |h| (h.start, h.end));
        let first = cuts.partition_point(|&c| c < lo);
        let last = cuts.partition_point(|&c| c < hi);
        first..last.max(first)
    };
    let seg_heads = |k: usize| HeadRange::from((cuts[k], cuts[k + 1]));
    // (send, arrival it waits for), over every rank.
    let mut waits_on: Vec<(usize, usize)> = Vec::new();
    for (rank, mut evs) in events.into_iter().enumerate() {
        let rank = rank as u32;
        evs.sort_unstable_by_key(|e| (e.0, e.1, e.2));
        let mut held: FastMap<Key, Partials> = FastMap::default();
        for (_, _, _, ev) in evs {
            match ev {
                Event::Computed(q, heads) => {
                    for k in segs(heads) {
                        let p = held.entry((q.doc, k)).or_default();
                        p.pending.insert(q.start, q.end);
                        p.ever.insert(q.start, q.end);
                    }
                }
                Event::Arrived(i) => {
                    let t = &plan.transfers[i];
                    for r in &t.ranges {
                        for k in segs(t.heads) {
                            let p = held.entry((r.doc, k)).or_default();
                            p.pending.insert(r.start, r.end);
                            p.ever.insert(r.start, r.end);
                            p.arrived.push((r.start, r.end, i));
                        }
                    }
                }
                Event::Sent(i) => {
                    let t = &plan.transfers[i];
                    for r in &t.ranges {
                        let mut again: Option<(u64, u64, HeadRange)> = None;
                        for k in segs(t.heads) {
                            let p = held.entry((r.doc, k)).or_default();
                            waits_on.extend(
                                p.arrived
                                    .iter()
                                    .filter(|&&(a, b, _)| a < r.end && r.start < b)
                                    .map(|&(_, _, j)| (i, j)),
                            );
                            for (gs, ge) in p.pending.take(r.start, r.end) {
                                // Never held at all is invariant 7's to report.
                                if let Some(&(a, b)) = p.ever.within(gs, ge).first() {
                                    again.get_or_insert((a, b, seg_heads(k)));
                                }
                            }
                        }
                        if let Some((a, b, h)) = again {
                            out.push(v(
                                ViolationKind::BadTransfer,
                                format!(
                                    "transfer {} → {} hands over the output of {} heads [{}, {}) at step {} after rank {} has handed it over already: an `out` transfer moves partial outputs, and its sender keeps no copy",
                                    t.src,
                                    t.dst,
                                    fmt_range(&TokenRange::new(r.doc, a, b)),
                                    h.start,
                                    h.end,
                                    t.issue_at,
                                    t.src
                                ),
                            ));
                        }
                    }
                }
            }
        }
        // What the rank computed or received and still holds at the end, where it does not
        // belong. (Bug hunt: rows it had computed and sent hid a partial of the same rows
        // received later.)
        let mut left: Vec<(Key, Vec<(u64, u64)>)> = held
            .iter()
            .map(|(&key, p)| (key, p.pending.0.iter().map(|(&s, &e)| (s, e)).collect()))
            .filter(|(_, pieces): &(Key, Vec<(u64, u64)>)| !pieces.is_empty())
            .collect();
        left.sort_unstable_by_key(|(key, _)| *key);
        for ((doc, k), pieces) in left {
            let h = seg_heads(k);
            for (s, e) in pieces {
                for &(os, oe, holder) in final_holder[doc as usize].overlapping(s, e) {
                    let (a, b) = (os.max(s), oe.min(e));
                    if a >= b || holder == rank {
                        continue;
                    }
                    out.push(v(
                        ViolationKind::OutputNotReturned,
                        format!(
                            "rank {rank} ends holding partial outputs of {} heads [{}, {}); they belong to rank {holder}, which holds those rows at the end: an `out` transfer issued after the last step computing them and after they arrive must take them there",
                            fmt_range(&TokenRange::new(doc, a, b)),
                            h.start,
                            h.end
                        ),
                    ));
                }
            }
        }
    }
    report_circular_forwards(plan, waits_on, out);
}

/// Sends of outputs that wait on each other in a circle: each forwards rows another's
/// delivery brings by its step, so none can leave (bug hunt: two ranks handing the same rows
/// to each other at one step passed, and hung the replay until its timeout). A piece of a
/// collective call is delivered when the call runs, which waits for every piece of it to
/// have its rows: the circle may pass through a call (bug hunt: outputs a call brings to one
/// rank, forwarded to another whose piece of the same call hands them on, passed and hung
/// the replay). Nodes are transfers, and past them one per call.
fn report_circular_forwards(plan: &Plan, waits_on: Vec<(usize, usize)>, out: &mut Vec<Violation>) {
    if waits_on.is_empty() {
        return;
    }
    let n = plan.transfers.len();
    let mut call_node: BTreeMap<(u32, crate::plan::TransferKind), usize> = BTreeMap::new();
    let mut node_of_call = |i: usize| {
        plan.transfers[i].call().map(|key| {
            let next = n + call_node.len();
            *call_node.entry(key).or_insert(next)
        })
    };
    let mut waits_on: Vec<(usize, usize)> = waits_on
        .into_iter()
        .map(|(i, j)| (node_of_call(i).unwrap_or(i), j))
        .collect();
    for j in 0..n {
        if plan.transfers[j].tensor == TransferTensor::Out {
            if let Some(c) = node_of_call(j) {
                waits_on.push((j, c));
            }
        }
    }
    let calls: BTreeMap<usize, u32> = call_node.iter().map(|(k, &c)| (c, k.0)).collect();
    waits_on.sort_unstable();
    waits_on.dedup();
    let mut next: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(i, j) in &waits_on {
        next.entry(i).or_default().push(j);
    }
    // Depth-first, iteratively: 1 = on the path, 2 = done.
    let mut state: FastMap<usize, u8> = FastMap::default();
    for &start in next.keys() {
        if state.contains_key(&start) {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        state.insert(start, 1);
        while let Some(&mut (node, ref mut k)) = path.last_mut() {
            let succ = next.get(&node).map_or(&[][..], Vec::as_slice);
            if let Some(&m) = succ.get(*k) {
                *k += 1;
                match state.get(&m) {
                    Some(1) => {
                        let from = path.iter().position(|&(x, _)| x == m).unwrap_or(0);
                        let circle: Vec<String> = path[from..]
                            .iter()
                            .map(|&(x, _)| match calls.get(&x) {
                                Some(id) => format!(
                                    "collective {id} (runs once all its pieces have their rows)"
                                ),
                                None => {
                                    let t = &plan.transfers[x];
                                    format!("{} → {} at step {}", t.src, t.dst, t.issue_at)
                                }
                            })
                            .collect();
                        out.push(v(
                            ViolationKind::Deadlock,
                            format!(
                                "`out` transfers wait on each other in a circle, each forwarding outputs the next one delivers by its step: {}",
                                circle.join(", then ")
                            ),
                        ));
                        return;
                    }
                    Some(_) => {}
                    None => {
                        state.insert(m, 1);
                        path.push((m, 0));
                    }
                }
            } else {
                state.insert(node, 2);
                path.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Inserting and taking intervals agrees with a set of tokens, gaps included.
        #[test]
        fn tokens_behave_as_a_set(
            ops in prop::collection::vec((any::<bool>(), 0u64..40, 0u64..12), 1..30),
        ) {
            let mut set = Tokens::default();
            let mut brute = BTreeSet::new();
            for (add, s, l) in ops {
                let e = s + l;
                if add {
                    set.insert(s, e);
                    brute.extend(s..e);
                } else {
                    let gaps: BTreeSet<u64> =
                        set.take(s, e).into_iter().flat_map(|(a, b)| a..b).collect();
                    let want: BTreeSet<u64> = (s..e).filter(|t| !brute.contains(t)).collect();
                    prop_assert_eq!(gaps, want);
                    for t in s..e {
                        brute.remove(&t);
                    }
                }
                let got: BTreeSet<u64> = set.0.iter().flat_map(|(&a, &b)| a..b).collect();
                prop_assert_eq!(&got, &brute);
                // Disjoint, non-empty, not touching.
                prop_assert!(set.0.iter().all(|(a, b)| a < b));
                let v: Vec<(u64, u64)> = set.0.iter().map(|(&a, &b)| (a, b)).collect();
                prop_assert!(v.windows(2).all(|w| w[0].1 < w[1].0));
            }
        }
    }
}
