//! Structural verification of a plan: every invariant of the IR, checked exactly.
//!
//! * every (q, k) pair the mask allows is computed exactly once (per query head);
//! * a task only reads Q and K/V that are local or have arrived by its step;
//! * a transfer only sends what its source holds when it is issued;
//! * partial outputs computed away from their queries' owner are returned to it;
//! * every token is owned by exactly one rank; per-rank tokens respect the memory cap;
//! * a plan that claims to be congestion-free has at most one send and one receive per rank in
//!   each round.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::{allowed_pairs, HeadRange, Plan, Task, TokenRange, TransferTensor, PLAN_VERSION};

/// What kind of invariant a violation breaks; tests and tools match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// Header fields are inconsistent (version, rank count, ids, heads).
    Header,
    /// A range or head range points outside its document or the model.
    BadRange,
    /// A token is owned by more than one rank.
    OwnedTwice,
    /// A token is owned by no rank.
    NotOwned,
    /// A rank owns more tokens than the declared memory cap.
    MemoryCap,
    /// A task's queries and keys belong to different documents.
    CrossDocument,
    /// A task in which the mask allows no pair.
    EmptyTask,
    /// Some allowed (q, k) pairs are computed by no task.
    MissingPairs,
    /// Some allowed (q, k) pairs are computed more than once.
    DuplicatePairs,
    /// A task reads Q or K/V that is neither local nor arrived by its step.
    NotAvailable,
    /// A transfer sends data its source does not hold at issue time, or is malformed.
    BadTransfer,
    /// A partial output is never returned to its queries' owner.
    OutputNotReturned,
    /// A congestion-free plan has a round where a rank sends or receives twice.
    Congestion,
}

/// One broken invariant, with a message that points at the offending item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Invariant broken.
    pub kind: ViolationKind,
    /// Human-readable description naming ranks, steps, documents and positions.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

fn v(kind: ViolationKind, message: String) -> Violation {
    Violation { kind, message }
}

fn fmt_range(r: &TokenRange) -> String {
    format!("doc {} [{}, {})", r.doc, r.start, r.end)
}

/// Check every structural invariant; an empty result means the plan is valid.
pub fn verify(plan: &Plan) -> Vec<Violation> {
    let mut out = Vec::new();
    check_header(plan, &mut out);
    if !out.is_empty() {
        // Later checks index by rank and document id; stop before they could misread.
        return out;
    }
    check_ranges(plan, &mut out);
    if !out.is_empty() {
        return out;
    }
    check_ownership(plan, &mut out);
    check_tasks(plan, &mut out);
    check_coverage(plan, &mut out);
    check_availability(plan, &mut out);
    check_congestion(plan, &mut out);
    out
}

fn check_header(plan: &Plan, out: &mut Vec<Violation>) {
    use ViolationKind::Header;
    if plan.version != PLAN_VERSION {
        out.push(v(
            Header,
            format!("version {} (expected {PLAN_VERSION})", plan.version),
        ));
    }
    if plan.num_ranks == 0 {
        out.push(v(Header, "num_ranks is 0".into()));
    }
    if plan.ranks.len() != plan.num_ranks as usize {
        out.push(v(
            Header,
            format!(
                "num_ranks {} but {} rank entries",
                plan.num_ranks,
                plan.ranks.len()
            ),
        ));
    }
    for (i, r) in plan.ranks.iter().enumerate() {
        if r.rank as usize != i {
            out.push(v(Header, format!("rank entry {i} has id {}", r.rank)));
        }
    }
    for (i, d) in plan.documents.iter().enumerate() {
        if d.id as usize != i {
            out.push(v(Header, format!("document entry {i} has id {}", d.id)));
        }
        if d.len == 0 {
            out.push(v(Header, format!("document {i} has length 0")));
        }
    }
    if plan.q_heads == 0 || plan.kv_heads == 0 {
        out.push(v(Header, "q_heads and kv_heads must be at least 1".into()));
    }
    for t in &plan.transfers {
        if t.src >= plan.num_ranks || t.dst >= plan.num_ranks || t.src == t.dst {
            out.push(v(
                Header,
                format!("transfer {} → {} names a bad rank pair", t.src, t.dst),
            ));
        }
    }
}

fn check_ranges(plan: &Plan, out: &mut Vec<Violation>) {
    let docs = &plan.documents;
    let bad_range = |r: &TokenRange| -> bool {
        docs.get(r.doc as usize)
            .is_none_or(|d| r.start >= r.end || r.end > d.len)
    };
    let bad_heads = |h: &Option<HeadRange>| -> bool {
        h.is_some_and(|h| h.start >= h.end || h.end > plan.q_heads)
    };
    for rp in &plan.ranks {
        for r in &rp.owned {
            if bad_range(r) {
                out.push(v(
                    ViolationKind::BadRange,
                    format!("rank {} owns {}", rp.rank, fmt_range(r)),
                ));
            }
        }
        for (s, step) in rp.steps.iter().enumerate() {
            for t in &step.tasks {
                if bad_range(&t.q) || bad_range(&t.kv) || bad_heads(&t.heads) {
                    out.push(v(
                        ViolationKind::BadRange,
                        format!(
                            "rank {} step {s}: task q {} kv {} heads {:?}",
                            rp.rank,
                            fmt_range(&t.q),
                            fmt_range(&t.kv),
                            t.heads
                        ),
                    ));
                }
            }
        }
    }
    for t in &plan.transfers {
        if t.ranges.iter().any(bad_range) || bad_heads(&t.heads) || t.ranges.is_empty() {
            out.push(v(
                ViolationKind::BadRange,
                format!(
                    "transfer {} → {}: a range is empty or out of bounds",
                    t.src, t.dst
                ),
            ));
        }
    }
}

/// Owner of each token, as sorted disjoint `(start, end, rank)` runs per document.
type OwnerMap = Vec<Vec<(u64, u64, u32)>>;

fn owner_map(plan: &Plan) -> OwnerMap {
    let mut map: OwnerMap = vec![Vec::new(); plan.documents.len()];
    for rp in &plan.ranks {
        for r in &rp.owned {
            map[r.doc as usize].push((r.start, r.end, rp.rank));
        }
    }
    for runs in &mut map {
        runs.sort_unstable();
    }
    map
}

fn check_ownership(plan: &Plan, out: &mut Vec<Violation>) {
    for (doc, runs) in owner_map(plan).iter().enumerate() {
        let len = plan.documents[doc].len;
        let mut pos = 0u64;
        for &(s, e, rank) in runs {
            if s < pos {
                out.push(v(
                    ViolationKind::OwnedTwice,
                    format!(
                        "doc {doc} tokens [{s}, {}) owned twice (rank {rank} and another)",
                        pos.min(e)
                    ),
                ));
            } else if s > pos {
                out.push(v(
                    ViolationKind::NotOwned,
                    format!("doc {doc} tokens [{pos}, {s}) owned by no rank"),
                ));
            }
            pos = pos.max(e);
        }
        if pos < len {
            out.push(v(
                ViolationKind::NotOwned,
                format!("doc {doc} tokens [{pos}, {len}) owned by no rank"),
            ));
        }
    }
    if let Some(cap) = plan.memory_cap_tokens {
        for rp in &plan.ranks {
            let tokens: u64 = rp.owned.iter().map(TokenRange::len).sum();
            if tokens > cap {
                out.push(v(
                    ViolationKind::MemoryCap,
                    format!("rank {} owns {tokens} tokens, cap is {cap}", rp.rank),
                ));
            }
        }
    }
}

fn check_tasks(plan: &Plan, out: &mut Vec<Violation>) {
    for rp in &plan.ranks {
        for (s, step) in rp.steps.iter().enumerate() {
            for t in &step.tasks {
                if t.q.doc != t.kv.doc {
                    out.push(v(
                        ViolationKind::CrossDocument,
                        format!(
                            "rank {} step {s}: queries of doc {} read K/V of doc {}",
                            rp.rank, t.q.doc, t.kv.doc
                        ),
                    ));
                } else if allowed_pairs(plan.mask, t.q.start, t.q.end, t.kv.start, t.kv.end) == 0 {
                    out.push(v(
                        ViolationKind::EmptyTask,
                        format!(
                            "rank {} step {s}: task q {} kv {} computes no pair under the {} mask",
                            rp.rank,
                            fmt_range(&t.q),
                            fmt_range(&t.kv),
                            plan.mask
                        ),
                    ));
                }
            }
        }
    }
}

/// The query-head segments every task boundary splits `[0, q_heads)` into. All heads inside one
/// segment are handled by exactly the same tasks, so checking one representative per segment
/// is exact.
pub(crate) fn head_segments(plan: &Plan) -> Vec<HeadRange> {
    let mut cuts = BTreeSet::from([0, plan.q_heads]);
    for t in plan
        .ranks
        .iter()
        .flat_map(|r| &r.steps)
        .flat_map(|s| &s.tasks)
    {
        if let Some(h) = t.heads {
            cuts.insert(h.start.min(plan.q_heads));
            cuts.insert(h.end.min(plan.q_heads));
        }
    }
    let cuts: Vec<u32> = cuts.into_iter().collect();
    cuts.windows(2)
        .map(|w| HeadRange {
            start: w[0],
            end: w[1],
        })
        .collect()
}

pub(crate) fn task_covers_heads(t: &Task, seg: HeadRange) -> bool {
    match t.heads {
        None => true,
        Some(h) => h.start <= seg.start && seg.end <= h.end,
    }
}

/// Tasks grouped by document: `(q0, q1, k0, k1, heads)` with the rank/step for messages.
fn tasks_by_doc(plan: &Plan) -> Vec<Vec<(&Task, u32, usize)>> {
    let mut by_doc = vec![Vec::new(); plan.documents.len()];
    for rp in &plan.ranks {
        for (s, step) in rp.steps.iter().enumerate() {
            for t in &step.tasks {
                if t.q.doc == t.kv.doc {
                    by_doc[t.q.doc as usize].push((t, rp.rank, s));
                }
            }
        }
    }
    by_doc
}

/// Exact-cover check by a sweep over query rows. Between consecutive task boundaries every row
/// `q` is handled by the same set of tasks; the row `b - 1` at the end of such an interval needs
/// exactly `[0, kv_limit(b - 1))`, and every other row of the interval needs a prefix of that.
/// So the tasks' kv ranges, clipped to that limit, must tile it without gap or overlap.
fn check_coverage(plan: &Plan, out: &mut Vec<Violation>) {
    const MAX_REPORTS_PER_DOC: usize = 4;
    let segments = head_segments(plan);
    for (doc, tasks) in tasks_by_doc(plan).iter().enumerate() {
        let len = plan.documents[doc].len;
        for &seg in &segments {
            let mut rects: Vec<(u64, u64, u64, u64)> = tasks
                .iter()
                .filter(|(t, _, _)| task_covers_heads(t, seg))
                .map(|(t, _, _)| (t.q.start, t.q.end, t.kv.start, t.kv.end))
                .collect();
            rects.sort_unstable();
            let mut cuts: BTreeSet<u64> = BTreeSet::from([0, len]);
            for r in &rects {
                cuts.insert(r.0);
                cuts.insert(r.1);
            }
            let cuts: Vec<u64> = cuts.into_iter().filter(|&c| c <= len).collect();
            let mut next = 0usize;
            let mut active: Vec<(u64, u64, u64, u64)> = Vec::new();
            let mut reports = 0;
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                active.retain(|r| r.1 > a);
                while next < rects.len() && rects[next].0 <= a {
                    if rects[next].1 > a {
                        active.push(rects[next]);
                    }
                    next += 1;
                }
                let limit = plan.mask.kv_limit(b - 1, len);
                let mut kv: Vec<(u64, u64)> = active
                    .iter()
                    .map(|r| (r.2, r.3.min(limit)))
                    .filter(|(s, e)| s < e)
                    .collect();
                kv.sort_unstable();
                let mut pos = 0u64;
                let mut problem: Option<(ViolationKind, u64, u64)> = None;
                for &(s, e) in &kv {
                    if s > pos {
                        problem.get_or_insert((ViolationKind::MissingPairs, pos, s));
                    } else if s < pos {
                        problem.get_or_insert((ViolationKind::DuplicatePairs, s, pos.min(e)));
                    }
                    pos = pos.max(e);
                }
                if pos < limit {
                    problem.get_or_insert((ViolationKind::MissingPairs, pos, limit));
                }
                if let Some((kind, k0, k1)) = problem {
                    if reports < MAX_REPORTS_PER_DOC {
                        let what = if kind == ViolationKind::MissingPairs {
                            "computed by no task"
                        } else {
                            "computed more than once"
                        };
                        out.push(v(
                            kind,
                            format!(
                                "doc {doc} heads [{}, {}): queries [{a}, {b}) × keys [{k0}, {k1}) {what}",
                                seg.start, seg.end
                            ),
                        ));
                    }
                    reports += 1;
                }
            }
            if reports > MAX_REPORTS_PER_DOC {
                out.push(v(
                    ViolationKind::MissingPairs,
                    format!(
                        "doc {doc}: {} more coverage problems not listed",
                        reports - MAX_REPORTS_PER_DOC
                    ),
                ));
            }
        }
    }
}

/// A run of tokens with the step it relates to and the heads it carries:
/// `(start, end, step, heads)`.
type Run = (u64, u64, u32, Option<HeadRange>);

/// Where a range of a tensor becomes available on a rank, keyed by (rank, doc, tensor).
#[derive(Default)]
struct Holdings {
    runs: BTreeMap<(u32, u32, TransferTensor), Vec<Run>>,
}

impl Holdings {
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

    /// Whether `r` (for `heads`) is fully available on `rank` at `step`.
    fn has(
        &self,
        rank: u32,
        tensor: TransferTensor,
        r: &TokenRange,
        step: u32,
        heads: Option<HeadRange>,
    ) -> bool {
        let Some(runs) = self.runs.get(&(rank, r.doc, tensor)) else {
            return false;
        };
        let mut usable: Vec<(u64, u64)> = runs
            .iter()
            .filter(|(_, _, from, h)| *from <= step && heads_contain(*h, heads))
            .map(|(s, e, _, _)| (*s, *e))
            .collect();
        usable.sort_unstable();
        covers(&usable, r.start, r.end)
    }
}

/// Whether data held for heads `held` serves a reader of heads `wanted` (absent = all heads).
fn heads_contain(held: Option<HeadRange>, wanted: Option<HeadRange>) -> bool {
    match (held, wanted) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(h), Some(w)) => h.start <= w.start && w.end <= h.end,
    }
}

/// Whether sorted intervals cover `[start, end)`.
fn covers(sorted: &[(u64, u64)], start: u64, end: u64) -> bool {
    let mut pos = start;
    for &(s, e) in sorted {
        if s > pos {
            break;
        }
        pos = pos.max(e);
        if pos >= end {
            return true;
        }
    }
    pos >= end
}

fn check_availability(plan: &Plan, out: &mut Vec<Violation>) {
    use TransferTensor::{Kv, Out, Q};
    let mut held = Holdings::default();
    for rp in &plan.ranks {
        for r in &rp.owned {
            held.add(rp.rank, Kv, r, 0, None);
            held.add(rp.rank, Q, r, 0, None);
        }
    }
    // Computed outputs: available to send once the step that computed them has finished.
    for rp in &plan.ranks {
        for (s, step) in rp.steps.iter().enumerate() {
            for t in &step.tasks {
                held.add(rp.rank, Out, &t.q, s as u32 + 1, t.heads);
            }
        }
    }
    for t in &plan.transfers {
        if t.tensor != Out {
            for r in &t.ranges {
                held.add(t.dst, t.tensor, r, t.arrive_by, t.heads);
            }
        }
    }
    for t in &plan.transfers {
        if t.tensor != Out && t.issue_at > t.arrive_by {
            out.push(v(
                ViolationKind::BadTransfer,
                format!(
                    "transfer {} → {} issued at step {} but due by step {}",
                    t.src, t.dst, t.issue_at, t.arrive_by
                ),
            ));
        }
        for r in &t.ranges {
            if !held.has(t.src, t.tensor, r, t.issue_at, t.heads) {
                out.push(v(
                    ViolationKind::BadTransfer,
                    format!(
                        "transfer {} → {} sends {:?} of {} at step {} but rank {} does not hold it then",
                        t.src, t.dst, t.tensor, fmt_range(r), t.issue_at, t.src
                    ),
                ));
            }
        }
    }
    let owners = owner_map(plan);
    // Output returns, by (src, dst, doc): (start, end, issue_at, heads).
    let mut returned: BTreeMap<(u32, u32, u32), Vec<Run>> = BTreeMap::new();
    for t in plan.transfers.iter().filter(|t| t.tensor == Out) {
        for r in &t.ranges {
            returned
                .entry((t.src, t.dst, r.doc))
                .or_default()
                .push((r.start, r.end, t.issue_at, t.heads));
        }
    }
    let is_returned =
        |src: u32, dst: u32, piece: &TokenRange, step: u32, heads: Option<HeadRange>| {
            let Some(runs) = returned.get(&(src, dst, piece.doc)) else {
                return false;
            };
            let mut usable: Vec<(u64, u64)> = runs
                .iter()
                .filter(|(_, _, issue, h)| *issue > step && heads_contain(*h, heads))
                .map(|(s, e, _, _)| (*s, *e))
                .collect();
            usable.sort_unstable();
            covers(&usable, piece.start, piece.end)
        };
    for rp in &plan.ranks {
        for (s, step) in rp.steps.iter().enumerate() {
            let s32 = s as u32;
            for t in &step.tasks {
                for (tensor, r) in [(Q, &t.q), (Kv, &t.kv)] {
                    if !held.has(rp.rank, tensor, r, s32, t.heads) {
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
                // Queries owned elsewhere: their partial output must go back to the owner.
                for &(os, oe, owner) in &owners[t.q.doc as usize] {
                    let (s0, e0) = (os.max(t.q.start), oe.min(t.q.end));
                    if s0 >= e0 || owner == rp.rank {
                        continue;
                    }
                    let piece = TokenRange::new(t.q.doc, s0, e0);
                    let ok = is_returned(rp.rank, owner, &piece, s32, t.heads);
                    if !ok {
                        out.push(v(
                            ViolationKind::OutputNotReturned,
                            format!(
                                "rank {} step {s}: output of {} is never returned to its owner rank {owner}",
                                rp.rank,
                                fmt_range(&piece)
                            ),
                        ));
                    }
                }
            }
        }
    }
}

fn check_congestion(plan: &Plan, out: &mut Vec<Violation>) {
    if !plan.congestion_free {
        return;
    }
    let mut sends: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    let mut recvs: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for t in plan.transfers.iter().filter(|t| t.collective.is_none()) {
        *sends.entry((t.round(), t.src)).or_default() += 1;
        *recvs.entry((t.round(), t.dst)).or_default() += 1;
    }
    for (what, map) in [("sends", &sends), ("receives", &recvs)] {
        for (&(round, rank), &n) in map {
            if n > 1 {
                out.push(v(
                    ViolationKind::Congestion,
                    format!(
                        "round {round}: rank {rank} {what} {n} transfers in a congestion-free plan"
                    ),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ViolationKind as K;
    use super::*;
    use crate::plan::{Mask, Transfer};
    use crate::planners::testing::with_ctx;
    use crate::planners::{Planner, Zigzag};
    use crate::trace::Batch;

    fn plan() -> Plan {
        let batch = Batch::new(0, vec![5, 64, 200, 1]);
        with_ctx(4, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap()
    }

    fn kinds(p: &Plan) -> BTreeSet<ViolationKind> {
        verify(p).into_iter().map(|v| v.kind).collect()
    }

    /// Rank and step of the first non-empty step after step 0 (needs a received transfer).
    fn remote_step(p: &Plan) -> (usize, usize) {
        for (r, rp) in p.ranks.iter().enumerate() {
            for (s, st) in rp.steps.iter().enumerate().skip(1) {
                if !st.tasks.is_empty() {
                    return (r, s);
                }
            }
        }
        unreachable!("zigzag on 4 ranks has remote steps")
    }

    #[test]
    fn valid_plan_has_no_violation() {
        assert_eq!(verify(&plan()), vec![]);
    }

    #[test]
    fn rejects_removed_task() {
        let mut p = plan();
        p.ranks[1].steps[0].tasks.remove(0);
        assert!(kinds(&p).contains(&K::MissingPairs));
    }

    #[test]
    fn rejects_duplicated_task() {
        let mut p = plan();
        let (r, s) = remote_step(&p);
        let t = p.ranks[r].steps[s].tasks[0];
        p.ranks[(r + 1) % 4].steps[0].tasks.push(t);
        let k = kinds(&p);
        assert!(k.contains(&K::DuplicatePairs), "{k:?}");
    }

    #[test]
    fn rejects_removed_transfer() {
        let mut p = plan();
        let (r, s) = remote_step(&p);
        p.transfers
            .retain(|t| !(t.dst as usize == r && t.arrive_by as usize == s));
        assert!(kinds(&p).contains(&K::NotAvailable));
    }

    #[test]
    fn rejects_transfer_arriving_after_use() {
        let mut p = plan();
        let (r, s) = remote_step(&p);
        for t in &mut p.transfers {
            if t.dst as usize == r && t.arrive_by as usize == s {
                t.arrive_by += 1;
                t.issue_at += 1;
            }
        }
        assert!(kinds(&p).contains(&K::NotAvailable));
    }

    #[test]
    fn rejects_token_owned_twice() {
        let mut p = plan();
        let r = p.ranks[0].owned[0];
        p.ranks[2].owned.push(r);
        assert!(kinds(&p).contains(&K::OwnedTwice));
    }

    #[test]
    fn rejects_token_owned_by_nobody() {
        let mut p = plan();
        p.ranks[3].owned.pop();
        assert!(kinds(&p).contains(&K::NotOwned));
    }

    #[test]
    fn rejects_task_reading_another_documents_kv() {
        let mut p = plan();
        let t = &mut p.ranks[0].steps[0].tasks[0];
        t.kv.doc = if t.q.doc == 1 { 2 } else { 1 };
        t.kv.start = 0;
        t.kv.end = 1;
        assert!(kinds(&p).contains(&K::CrossDocument));
    }

    #[test]
    fn rejects_out_of_bounds_range() {
        let mut p = plan();
        p.ranks[0].steps[0].tasks[0].kv.end = 10_000;
        assert!(kinds(&p).contains(&K::BadRange));
    }

    #[test]
    fn rejects_memory_cap_violation() {
        let mut p = plan();
        p.memory_cap_tokens = Some(10);
        assert!(kinds(&p).contains(&K::MemoryCap));
    }

    #[test]
    fn rejects_false_congestion_free_claim() {
        let mut p = plan();
        p.congestion_free = true;
        assert_eq!(
            verify(&p),
            vec![],
            "a ring pass is one send and one receive per round"
        );
        let extra = Transfer::kv(0, 2, vec![p.ranks[0].owned[0]], 0, 1);
        p.transfers.push(extra);
        assert!(kinds(&p).contains(&K::Congestion));
    }

    #[test]
    fn rejects_sending_what_the_source_does_not_hold() {
        let mut p = plan();
        let foreign = p.ranks[3].owned[0];
        p.transfers.push(Transfer::kv(0, 1, vec![foreign], 0, 1));
        assert!(kinds(&p).contains(&K::BadTransfer));
    }

    #[test]
    fn rejects_bad_header() {
        let mut p = plan();
        p.num_ranks = 5;
        assert!(kinds(&p).contains(&K::Header));
    }

    #[test]
    fn remote_queries_need_their_output_returned() {
        // Rank 1 computes rank 0's queries after receiving them, but never returns the output.
        let mut p = plan();
        let q = p.ranks[0].owned[0];
        let mut qt = Transfer::kv(0, 1, vec![q], 0, 0);
        qt.tensor = TransferTensor::Q;
        p.transfers.push(qt);
        // Move rank 0's diagonal task for that range to rank 1 (its K/V is the same range).
        let idx = p.ranks[0].steps[0]
            .tasks
            .iter()
            .position(|t| t.q == q && t.kv == q)
            .unwrap();
        let task = p.ranks[0].steps[0].tasks.remove(idx);
        p.ranks[1].steps[0].tasks.push(task);
        let mut kvt = Transfer::kv(0, 1, vec![q], 0, 0);
        kvt.round = Some(100);
        p.transfers.push(kvt);
        assert_eq!(
            kinds(&p),
            BTreeSet::from([K::OutputNotReturned]),
            "{:?}",
            verify(&p)
        );
        let mut back = Transfer::kv(1, 0, vec![q], 1, 1);
        back.tensor = TransferTensor::Out;
        p.transfers.push(back);
        assert_eq!(verify(&p), vec![]);
    }
}
