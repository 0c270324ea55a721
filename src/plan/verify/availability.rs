//! Data availability: tasks read only what is local or has arrived, and transfers send only
//! what their source holds (where outputs go is [`super::output_flow`]'s to check).

use std::collections::BTreeMap;

use super::{fmt_range, v, Violation, ViolationKind};
use crate::hashing::FastMap;
use crate::plan::{HeadRange, Plan, TokenRange, TransferTensor};

/// A run of tokens with the step it relates to and the heads it carries:
/// `(start, end, step, heads)`.
type Run = (u64, u64, u32, Option<HeadRange>);

/// Runs of one tensor on one rank, indexed for "is `[start, end)` covered by runs whose step
/// passes a test". Plans at 1024 ranks hold about N pieces of a document per rank and ask about
/// N² tasks, so a linear scan per question is N³ (minutes); this answers in O(log runs) plus the
/// pieces the question overlaps.
///
/// Runs are grouped by their head range (all runs in a group serve the same readers; no head
/// range means all heads, `[0, q_heads)`). In each group the boundaries of all runs cut the
/// tokens into disjoint segments, and each segment keeps the best step of the runs covering
/// it — the earliest arrival, or the latest return. A segment is usable for a question exactly
/// when its best step passes, so the answer is exact.
struct StepIndex {
    groups: Vec<(HeadRange, Vec<Segment>)>,
    /// Every query head, `[0, q_heads)`: what a run or question without heads stands for.
    all: HeadRange,
}

/// Disjoint tokens `[start, end)` with the best step of the runs covering them.
type Segment = (u64, u64, u32);

impl StepIndex {
    /// Index `runs` of a plan of `q_heads` query heads, keeping per segment the step `better`
    /// prefers of two (`min` or `max`).
    fn new(mut runs: Vec<Run>, better: fn(u32, u32) -> u32, q_heads: u32) -> StepIndex {
        let all = HeadRange::from((0, q_heads));
        for r in &mut runs {
            r.3 = Some(r.3.unwrap_or(all));
        }
        runs.sort_unstable_by_key(|r| (r.3.map(|h| (h.start, h.end)), r.0, r.1));
        let mut groups = Vec::new();
        for chunk in runs.chunk_by(|a, b| a.3 == b.3) {
            groups.push((chunk[0].3.unwrap_or(all), segments(chunk, better)));
        }
        StepIndex { groups, all }
    }

    /// Whether runs whose step passes `ok` cover `[start, end)` for every head of `heads`
    /// (all heads when `None`). Heads may be held in parts: data for heads `[0, 32)` and
    /// `[32, 64)` serves a reader of all 64, and data for `[0, 64)` a reader without heads
    /// (bug hunt: both were refused, though the executor ran them).
    fn covers(
        &self,
        start: u64,
        end: u64,
        heads: Option<HeadRange>,
        ok: impl Fn(u32) -> bool,
    ) -> bool {
        let want = heads.unwrap_or(self.all);
        if self.covers_with(start, end, want, &ok) {
            return true;
        }
        // Groups holding part of the wanted heads: cut them at those groups' edges, and ask
        // for each piece of heads in turn.
        let mut cuts: Vec<u32> = self
            .groups
            .iter()
            .flat_map(|(h, _)| [h.start, h.end])
            .filter(|&c| want.start < c && c < want.end)
            .collect();
        if cuts.is_empty() {
            return false;
        }
        cuts.extend([want.start, want.end]);
        cuts.sort_unstable();
        cuts.dedup();
        cuts.windows(2)
            .all(|w| self.covers_with(start, end, HeadRange::from((w[0], w[1])), &ok))
    }

    /// Whether the groups that each hold every head of `want` cover `[start, end)` with
    /// segments whose step passes `ok`.
    fn covers_with(
        &self,
        start: u64,
        end: u64,
        want: HeadRange,
        ok: &impl Fn(u32) -> bool,
    ) -> bool {
        // The serving groups' segments are each sorted and disjoint, so their union covers
        // `[start, end)` exactly when, from `start`, some group always has a usable segment
        // holding the covered prefix's end: advance through every group in turn until none
        // moves it. This allocates nothing; gathering and sorting the groups' segments for
        // every question did.
        let mut pos = start;
        loop {
            if pos >= end {
                return true;
            }
            let before = pos;
            for (_, segs) in self
                .groups
                .iter()
                .filter(|(held, _)| held.start <= want.start && want.end <= held.end)
            {
                let mut i = segs.partition_point(|s| s.1 <= pos);
                while let Some(&(s, e, step)) = segs.get(i) {
                    if s > pos || !ok(step) {
                        break;
                    }
                    pos = e;
                    i += 1;
                }
            }
            if pos == before {
                return false;
            }
        }
    }
}

/// Disjoint sorted segments of `runs` (sorted by start) with the best step covering each.
fn segments(runs: &[Run], better: fn(u32, u32) -> u32) -> Vec<Segment> {
    // Runs that do not overlap (what a rank holds of a partition: its own pieces and an
    // all-gather's shards) are their own segments; only overlaps need the sweep, whose sort
    // and ordered map were a fifth of verifying per-doc CP at 256 ranks.
    if runs.windows(2).all(|w| w[0].1 <= w[1].0) {
        disjoint_segments(runs)
    } else {
        swept_segments(runs, better)
    }
}

/// [`segments`] of runs that do not overlap: the runs themselves, adjacent ones of one step
/// joined as the sweep joins them.
fn disjoint_segments(runs: &[Run]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::with_capacity(runs.len());
    for &(a, b, step, _) in runs.iter().filter(|r| r.0 < r.1) {
        match out.last_mut() {
            Some(last) if last.1 == a && last.2 == step => last.1 = b,
            _ => out.push((a, b, step)),
        }
    }
    out
}

/// [`segments`] of any runs, by a sweep over their boundaries.
fn swept_segments(runs: &[Run], better: fn(u32, u32) -> u32) -> Vec<Segment> {
    let mut cuts: Vec<u64> = runs.iter().flat_map(|r| [r.0, r.1]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    // Sweep the cuts; runs enter in start order and leave when their end is passed. The
    // active steps are a multiset so a leaving run removes only its own step.
    let mut active: BTreeMap<u32, usize> = BTreeMap::new();
    let mut ends: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u32)>> =
        std::collections::BinaryHeap::new();
    let mut next = 0;
    let mut out: Vec<Segment> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        while let Some(&std::cmp::Reverse((e, step))) = ends.peek() {
            if e > a {
                break;
            }
            ends.pop();
            if let Some(n) = active.get_mut(&step) {
                *n -= 1;
                if *n == 0 {
                    active.remove(&step);
                }
            }
        }
        while next < runs.len() && runs[next].0 <= a {
            let r = runs[next];
            if r.1 > a {
                *active.entry(r.2).or_default() += 1;
                ends.push(std::cmp::Reverse((r.1, r.2)));
            }
            next += 1;
        }
        let (Some((&lo, _)), Some((&hi, _))) = (active.first_key_value(), active.last_key_value())
        else {
            continue;
        };
        let step = better(lo, hi);
        match out.last_mut() {
            Some(last) if last.1 == a && last.2 == step => last.1 = b,
            _ => out.push((a, b, step)),
        }
    }
    out
}

/// Where a range of a tensor becomes available on a rank, keyed by (rank, doc, tensor). Hashed:
/// FlashCP's plan of 256 ranks adds 15 million ranges.
struct Holdings {
    runs: FastMap<(u32, u32, TransferTensor), Vec<Run>>,
    q_heads: u32,
}

impl Holdings {
    /// Nothing held yet, in a plan of `q_heads` query heads.
    fn new(q_heads: u32) -> Holdings {
        Holdings {
            runs: FastMap::default(),
            q_heads,
        }
    }

    fn add(
        &mut self,
        rank: u32,
        tensor: TransferTensor,
        r: &TokenRange,
        step: u32,
        heads: Option<HeadRange>,
    ) {
        self.runs
            .entry((rank, r.doc, tensor))
            .or_default()
            .push((r.start, r.end, step, heads));
    }

    /// The holdings indexed for [`Held::has`], by earliest arrival.
    fn index(self) -> Held {
        Held {
            runs: self
                .runs
                .into_iter()
                .map(|(k, runs)| (k, StepIndex::new(runs, u32::min, self.q_heads)))
                .collect(),
        }
    }
}

/// [`Holdings`] indexed for queries (hashed: one lookup per task and transfer range).
struct Held {
    runs: FastMap<(u32, u32, TransferTensor), StepIndex>,
}

impl Held {
    /// Whether `r` (for `heads`) is fully available on `rank` at `step`.
    fn has(
        &self,
        rank: u32,
        tensor: TransferTensor,
        r: &TokenRange,
        step: u32,
        heads: Option<HeadRange>,
    ) -> bool {
        self.runs
            .get(&(rank, r.doc, tensor))
            .is_some_and(|idx| idx.covers(r.start, r.end, heads, |from| from <= step))
    }
}

/// One question for [`Held::mark_unavailable`]: is `[start, end)` of `doc`'s `tensor` (for `heads`)
/// on the asking rank by `step`? `origin` numbers the question in the caller's order.
#[derive(Clone, Copy)]
struct Ask {
    doc: u32,
    tensor: TransferTensor,
    heads: Option<HeadRange>,
    start: u64,
    end: u64,
    step: u32,
    origin: u32,
}

impl Ask {
    fn new(r: &TokenRange, tensor: TransferTensor, heads: Option<HeadRange>, step: u32) -> Ask {
        Ask {
            doc: r.doc,
            tensor,
            heads,
            start: r.start,
            end: r.end,
            step,
            origin: 0,
        }
    }
}

impl Held {
    /// Mark `missing[origin]` for each of the `asks` of `rank` whose data is not there in
    /// time.
    ///
    /// Answers [`Held::has`] for many questions of one rank at once, grouped by document and
    /// tensor (a stable sort on one integer): each index is then read while it is in cache.
    /// Asked in plan order instead, every task of a 64-rank zigzag plan (3.8 million) missed
    /// the cache on another document's index: 9 of its 15 s of `verify`.
    fn mark_unavailable(&self, rank: u32, asks: &mut [Ask], missing: &mut [bool]) {
        asks.sort_by_key(|a| ((a.doc as u64) << 2) | a.tensor as u64);
        let mut index: Option<(u32, TransferTensor, Option<&StepIndex>)> = None;
        for a in asks.iter() {
            if index.is_none_or(|(d, t, _)| (d, t) != (a.doc, a.tensor)) {
                index = Some((a.doc, a.tensor, self.runs.get(&(rank, a.doc, a.tensor))));
            }
            let held = index
                .and_then(|(_, _, idx)| idx)
                .is_some_and(|idx| idx.covers(a.start, a.end, a.heads, |from| from <= a.step));
            missing[a.origin as usize] = !held;
        }
    }
}

pub(super) fn check_availability(plan: &Plan, out: &mut Vec<Violation>) {
    use TransferTensor::{Kv, Out, Q};
    // Only output transfers ask about computed outputs; a plan without any (ring, zigzag: 3.8
    // million tasks at 64 ranks) skips listing them.
    let returns_outputs = plan.transfers.iter().any(|t| t.tensor == Out);
    // The transfers delivered to each rank, and those each rank sends.
    let mut into: Vec<Vec<usize>> = vec![Vec::new(); plan.ranks.len()];
    let mut by_src: Vec<Vec<usize>> = vec![Vec::new(); plan.ranks.len()];
    for d in plan.deliveries() {
        into[d.dst as usize].push(d.index);
    }
    // Every transfer range, numbered in plan order, asked of its source one source at a time.
    let mut first_origin = Vec::with_capacity(plan.transfers.len());
    let mut origin = 0u32;
    for (i, t) in plan.transfers.iter().enumerate() {
        first_origin.push(origin);
        origin += t.ranges.len() as u32;
        by_src[t.src as usize].push(i);
    }
    let mut unsent = vec![false; origin as usize];
    // Per rank, the task reads (Q then K/V of each task, in step order) that are not there.
    let mut unread: Vec<Vec<bool>> = Vec::with_capacity(plan.ranks.len());
    // Per rank, its owned ranges whose Q or K/V never reach it (reshuffled plans only).
    let mut never_owned: Vec<Vec<[bool; 2]>> = Vec::with_capacity(plan.ranks.len());
    let mut asks: Vec<Ask> = Vec::new();
    // One rank's holdings at a time: an all-gather delivers every shard to every rank, so all
    // ranks' holdings at once are N times the plan (5 GB for per-doc CP at 256 ranks).
    let sent_at = send_steps(plan);
    for rank in 0..plan.ranks.len() {
        let held = holdings_of(plan, rank as u32, &into[rank], returns_outputs);
        asks.clear();
        for &i in &by_src[rank] {
            let t = &plan.transfers[i];
            asks.extend(
                t.ranges
                    .iter()
                    .zip(first_origin[i]..)
                    .map(|(r, origin)| Ask {
                        origin,
                        ..Ask::new(r, t.tensor, t.heads, sent_at[i])
                    }),
            );
        }
        held.mark_unavailable(rank as u32, &mut asks, &mut unsent);
        // The rank's reads, numbered in the order they are reported.
        let rp = &plan.ranks[rank];
        asks.clear();
        for (s, step) in rp.steps.iter().enumerate() {
            for t in &step.tasks {
                for (tensor, r) in [(Q, &t.q), (Kv, &t.kv)] {
                    let origin = asks.len() as u32;
                    asks.push(Ask {
                        origin,
                        ..Ask::new(r, tensor, t.heads, s as u32)
                    });
                }
            }
        }
        let mut missing = vec![false; asks.len()];
        held.mark_unavailable(rp.rank, &mut asks, &mut missing);
        unread.push(missing);
        if plan.input_layout.is_some() {
            never_owned.push(
                rp.owned
                    .iter()
                    .map(|r| [Q, Kv].map(|tensor| !held.has(rp.rank, tensor, r, u32::MAX, None)))
                    .collect(),
            );
        }
    }
    super::call_relay::check_call_relays(plan, out);
    let mut unsent = unsent.into_iter();
    for (t, &at) in plan.transfers.iter().zip(&sent_at) {
        // Outputs too (bug hunt: an `out` transfer due before it was issued passed, and the
        // replay refused it).
        if t.issue_at > t.arrive_by {
            out.push(v(
                ViolationKind::BadTransfer,
                format!(
                    "transfer {} → {} issued at step {} but due by step {}",
                    t.src, t.dst, t.issue_at, t.arrive_by
                ),
            ));
        }
        for r in &t.ranges {
            if unsent.next().unwrap_or(false) {
                out.push(v(
                    ViolationKind::BadTransfer,
                    format!(
                        "transfer {} → {} sends {:?} of {} at step {at}{} but rank {} does not hold it then",
                        t.src,
                        t.dst,
                        t.tensor,
                        fmt_range(r),
                        if at < t.issue_at {
                            format!(
                                " (it joins collective {} then, at its earliest piece)",
                                t.collective.unwrap_or(0)
                            )
                        } else {
                            String::new()
                        },
                        t.src
                    ),
                ));
            }
        }
    }
    for (rp, unread) in plan.ranks.iter().zip(unread) {
        let mut unread = unread.into_iter();
        for (s, step) in rp.steps.iter().enumerate() {
            for t in &step.tasks {
                for (tensor, r) in [(Q, &t.q), (Kv, &t.kv)] {
                    if unread.next().unwrap_or(false) {
                        out.push(v(
                            ViolationKind::NotAvailable,
                            format!(
                                "rank {} step {s}: {:?} of {} is not local and has not arrived",
                                rp.rank,
                                tensor,
                                fmt_range(r)
                            ),
                        ));
                    }
                }
            }
        }
    }
    if plan.input_layout.is_some() {
        check_reshuffle(plan, &never_owned, out);
    }
}

/// The step at which each transfer's source sends it: its `issue_at`, or for a piece of a
/// collective call the step its source joins the call, the earliest `issue_at` of a piece the
/// source sends or receives in it (invariant 12, `sim::program`). Bug hunt: a piece forwarding
/// data due at step 1 in a call its source joined at step 0 passed, and the replay hung.
pub(super) fn send_steps(plan: &Plan) -> Vec<u32> {
    let joins = super::call_joins(plan);
    plan.transfers
        .iter()
        .map(|t| match t.call() {
            Some((id, kind)) => joins[&(id, kind)][&t.src],
            None => t.issue_at,
        })
        .collect()
}

/// What `rank` holds, indexed by earliest arrival: its input layout (its owned ranges when the
/// plan has none) from the start, the outputs it computes once their step is done (when
/// `outputs`), and what the transfers `into` deliver to it, outputs included: a rank may pass
/// on outputs it received (a planned owner returning merged rows to their input owner).
fn holdings_of(plan: &Plan, rank: u32, into: &[usize], outputs: bool) -> Held {
    use TransferTensor::{Kv, Out, Q};
    let mut held = Holdings::new(plan.q_heads);
    for r in plan.initial(rank as usize) {
        held.add(rank, Kv, r, 0, None);
        held.add(rank, Q, r, 0, None);
    }
    if outputs {
        for (s, step) in plan.ranks[rank as usize].steps.iter().enumerate() {
            for t in &step.tasks {
                held.add(rank, Out, &t.q, s as u32 + 1, t.heads);
            }
        }
    }
    for &i in into {
        let t = &plan.transfers[i];
        for r in &t.ranges {
            held.add(rank, t.tensor, r, t.arrive_by, t.heads);
        }
    }
    held.index()
}

/// With an input layout: every rank receives the Q and K/V of what it owns (that every output
/// row reaches its input owner is [`super::output_flow`]'s to check, as every return is).
///
/// `never_owned[rank][i]` says whether the Q and K/V of the rank's `i`-th owned range never
/// reach it.
fn check_reshuffle(plan: &Plan, never_owned: &[Vec<[bool; 2]>], out: &mut Vec<Violation>) {
    use TransferTensor::{Kv, Q};
    for (rp, never) in plan.ranks.iter().zip(never_owned) {
        for (r, never) in rp.owned.iter().zip(never) {
            for (tensor, never) in [Q, Kv].into_iter().zip(never) {
                if *never {
                    out.push(v(
                        ViolationKind::NotAvailable,
                        format!(
                            "rank {} owns {} but its {tensor:?} never reaches it from the input layout",
                            rp.rank,
                            fmt_range(r)
                        ),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn heads(h: u8) -> Option<HeadRange> {
        // 0: all heads; otherwise one of three ranges, two of them nested.
        match h % 4 {
            0 => None,
            1 => Some(HeadRange::from((0, 8))),
            2 => Some(HeadRange::from((0, 4))),
            _ => Some(HeadRange::from((4, 8))),
        }
    }

    /// The origins, ascending, of the asks `mark_unavailable` marks missing.
    fn unavailable(held: &Held, rank: u32, asks: &mut [Ask]) -> Vec<u32> {
        let mut missing = vec![false; asks.len()];
        held.mark_unavailable(rank, asks, &mut missing);
        (0..asks.len() as u32)
            .filter(|&i| missing[i as usize])
            .collect()
    }

    fn tensor(t: u8) -> TransferTensor {
        [TransferTensor::Q, TransferTensor::Kv, TransferTensor::Out][t as usize % 3]
    }

    /// A range asked at a step before it arrives and again after, in any order: each answer
    /// is its own (a rule reusing answers across steps got this wrong; proptest's shrunk case).
    #[test]
    fn a_range_missing_at_one_step_is_there_at_the_next() {
        let mut h = Holdings::new(8);
        h.add(1, TransferTensor::Q, &TokenRange::new(1, 11, 30), 1, None);
        let held = h.index();
        let ask = |step, origin| Ask {
            origin,
            ..Ask::new(&TokenRange::new(1, 20, 30), TransferTensor::Q, None, step)
        };
        let mut asks = vec![ask(1, 0), ask(0, 1), ask(0, 2), ask(2, 3)];
        assert_eq!(unavailable(&held, 1, &mut asks), vec![1, 2]);
    }

    proptest! {
        /// Runs that do not overlap give the same segments by the shortcut as by the sweep,
        /// touching and equal-step neighbours included.
        #[test]
        fn disjoint_runs_are_their_own_segments(
            pieces in prop::collection::vec((0u64..3, 1u64..4, 0u32..3), 0..20),
        ) {
            let mut runs: Vec<Run> = Vec::new();
            let mut pos = 0;
            for (gap, len, step) in pieces {
                runs.push((pos + gap, pos + gap + len, step, None));
                pos += gap + len;
            }
            for better in [u32::min as fn(u32, u32) -> u32, u32::max] {
                prop_assert_eq!(disjoint_segments(&runs), swept_segments(&runs, better));
            }
        }

        /// An index answers as the runs do token by token: `[start, end)` is covered when
        /// every token of it lies in a run that serves the heads asked and whose step passes,
        /// for earliest arrivals and latest returns, with nested and disjoint head groups.
        #[test]
        fn an_index_covers_what_its_runs_cover_token_by_token(
            runs in prop::collection::vec((0u64..30, 1u64..12, 0u32..4, 0u8..4), 0..14),
            start in 0u64..40,
            len in 0u64..15,
            step in 0u32..5,
            asked in 0u8..4,
        ) {
            let runs: Vec<Run> = runs.iter().map(|&(s, l, st, h)| (s, s + l, st, heads(h))).collect();
            let (end, wanted) = (start + len, heads(asked));
            let all = HeadRange::from((0, 8));
            let w = wanted.unwrap_or(all);
            type Pass = fn(u32, u32) -> bool;
            let arrived: Pass = |from, step| from <= step;
            let returned: Pass = |issue, step| issue > step;
            for (better, ok) in [(u32::min as fn(u32, u32) -> u32, arrived), (u32::max, returned)] {
                // Every (token, head) asked is in a run holding that head.
                let brute = (start..end).all(|t| {
                    (w.start..w.end).all(|head| {
                        runs.iter().any(|r| {
                            let h = r.3.unwrap_or(all);
                            r.0 <= t && t < r.1 && h.start <= head && head < h.end && ok(r.2, step)
                        })
                    })
                });
                let index = StepIndex::new(runs.clone(), better, 8);
                prop_assert_eq!(index.covers(start, end, wanted, |s| ok(s, step)), brute);
            }
        }

        /// Answering a rank's questions in one sorted batch gives exactly the questions that
        /// [`Held::has`] answers no to one by one, repeated ranges and head splits included.
        #[test]
        fn batched_answers_equal_one_by_one(
            runs in prop::collection::vec((0u32..2, 0u8..3, 0u32..3, 0u64..40, 1u64..20, 0u32..4, 0u8..4), 0..30),
            // Few distinct ranges, so that one range is often asked at several steps.
            asks in prop::collection::vec((0u32..2, 0u8..3, 0u32..2, 0u64..4, 1u64..3, 0u32..5, 0u8..4), 1..60),
        ) {
            let mut h = Holdings::new(8);
            for &(rank, t, doc, s, l, step, hd) in &runs {
                h.add(rank, tensor(t), &TokenRange::new(doc, s, s + l), step, heads(hd));
            }
            let held = h.index();
            for rank in 0..2u32 {
                let mut batch: Vec<Ask> = asks
                    .iter()
                    .filter(|a| a.0 == rank)
                    .enumerate()
                    .map(|(i, &(_, t, doc, s, l, step, hd))| Ask {
                        origin: i as u32,
                        ..Ask::new(&TokenRange::new(doc, 10 * s, 10 * (s + l)), tensor(t), heads(hd), step)
                    })
                    .collect();
                let expected: Vec<u32> = batch
                    .iter()
                    .filter(|a| {
                        let r = TokenRange::new(a.doc, a.start, a.end);
                        !held.has(rank, a.tensor, &r, a.step, a.heads)
                    })
                    .map(|a| a.origin)
                    .collect();
                prop_assert_eq!(unavailable(&held, rank, &mut batch), expected);
            }
        }
    }
}
