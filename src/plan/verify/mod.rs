//! Structural verification of a plan: every invariant of the IR, checked exactly.
//!
//! * every (q, k) pair the mask allows is computed exactly once (per query head);
//! * a task only reads Q and K/V that are local or have arrived by its step;
//! * a transfer only sends what its source holds when it is issued;
//! * partial outputs computed away from their queries' owner are returned to it, and move
//!   without being copied: each is handed over once and ends where its rows are held;
//! * every token is owned by exactly one rank; per-rank tokens respect the memory cap;
//! * a plan that claims to be congestion-free has at most one send and one receive per rank in
//!   each round;
//! * every rank has the same number of steps.

use std::collections::BTreeMap;
use std::fmt;

use super::{
    allowed_pairs, HeadRange, Plan, RunIndex, Task, TokenRange, TransferTensor, PLAN_VERSION,
    PLAN_VERSIONS,
};

mod availability;
mod call_relay;
mod coverage;
mod output_flow;
mod progress;
#[cfg(test)]
mod tests;

pub(crate) use coverage::{head_segments, task_covers_heads};

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
    /// Ranks have different numbers of steps (the format pads every rank to the same count).
    StepCount,
    /// Some rank can never start a step: its inputs wait, directly or through others, on
    /// itself (a collective whose members join after its receiver needs it).
    Deadlock,
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

pub(super) fn v(kind: ViolationKind, message: String) -> Violation {
    Violation { kind, message }
}

pub(super) fn fmt_range(r: &TokenRange) -> String {
    format!("doc {} [{}, {})", r.doc, r.start, r.end)
}

/// Where a task is and what it computes, for messages.
pub(super) fn fmt_task(rank: u32, step: usize, t: &Task) -> String {
    let heads = t.heads.map_or(String::new(), |h| {
        format!(" heads [{}, {})", h.start, h.end)
    });
    format!(
        "rank {rank} step {step}: task q {} × kv {}{heads}",
        fmt_range(&t.q),
        fmt_range(&t.kv)
    )
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
    check_step_counts(plan, &mut out);
    check_ownership(plan, &mut out);
    check_tasks(plan, &mut out);
    coverage::check_coverage(plan, &mut out);
    availability::check_availability(plan, &mut out);
    output_flow::check_output_flow(plan, &mut out);
    check_congestion(plan, &mut out);
    progress::check_progress(plan, &mut out);
    out
}

fn check_header(plan: &Plan, out: &mut Vec<Violation>) {
    use ViolationKind::Header;
    if !PLAN_VERSIONS.contains(&plan.version) {
        out.push(v(
            Header,
            format!("version {} (expected 1 to {PLAN_VERSION})", plan.version),
        ));
    } else if plan.version < plan.required_version() {
        let (found, needed) = (plan.version, plan.required_version());
        out.push(v(
            Header,
            format!(
                "version {found} but a transfer lists `also_to` receivers, which need version {needed}: a reader of version {found} would drop them"
            ),
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
        if r.pad_slots > MAX_PAD_SLOTS {
            out.push(v(
                Header,
                format!(
                    "rank entry {i} has pad_slots {}, more than the {MAX_PAD_SLOTS} (2^32) buffer slots a rank may pad",
                    r.pad_slots
                ),
            ));
        }
    }
    check_params(plan, out);
    for (i, d) in plan.documents.iter().enumerate() {
        if d.id as usize != i {
            out.push(v(Header, format!("document entry {i} has id {}", d.id)));
        }
        if d.len == 0 {
            out.push(v(Header, format!("document {i} has length 0")));
        }
        if d.extent() > crate::trace::MAX_DOC_LEN {
            out.push(v(
                Header,
                format!(
                    "document {i} spans {} tokens, more than the {} a document may have",
                    d.extent(),
                    crate::trace::MAX_DOC_LEN
                ),
            ));
        }
    }
    if let Some(tp) = plan.tp {
        if !(1..=crate::tp::MAX_TP).contains(&tp) {
            out.push(v(
                Header,
                format!(
                    "tp {tp}: the tensor-parallel degree is 1 to {} (absent is 1)",
                    crate::tp::MAX_TP
                ),
            ));
        }
    }
    if plan.q_heads == 0 || plan.kv_heads == 0 {
        out.push(v(Header, "q_heads and kv_heads must be at least 1".into()));
    } else if plan.q_heads % plan.kv_heads != 0 {
        out.push(v(
            Header,
            format!(
                "q_heads {} is not a multiple of kv_heads {}: grouped-query attention shares each K/V head among a whole group of query heads",
                plan.q_heads, plan.kv_heads
            ),
        ));
    }
    if let Some(l) = &plan.input_layout {
        if l.len() != plan.num_ranks as usize {
            out.push(v(
                Header,
                format!(
                    "input_layout has {} rank entries, num_ranks is {}",
                    l.len(),
                    plan.num_ranks
                ),
            ));
        }
    }
    for t in &plan.transfers {
        if t.src >= plan.num_ranks || t.dst >= plan.num_ranks || t.src == t.dst {
            out.push(v(
                Header,
                format!("transfer {} → {} names a bad rank pair", t.src, t.dst),
            ));
        }
        check_also_to(plan, t, out);
    }
}

/// A multicast's further receivers exist, differ from its source and from each other, and
/// receive Q or K/V: an output has one owner to go back to.
fn check_also_to(plan: &Plan, t: &crate::plan::Transfer, out: &mut Vec<Violation>) {
    if t.also_to.is_empty() {
        return;
    }
    let mut seen = std::collections::BTreeSet::from([t.src, t.dst]);
    for &r in &t.also_to {
        if r >= plan.num_ranks || !seen.insert(r) {
            out.push(v(
                ViolationKind::Header,
                format!(
                    "transfer {} → {}: also_to names rank {r}, which does not exist or is the source or already a receiver",
                    t.src, t.dst
                ),
            ));
        }
    }
    if t.tensor == TransferTensor::Out {
        out.push(v(
            ViolationKind::Header,
            format!(
                "transfer {} → {}: an output return has one receiver (its queries' owner), but also_to lists {}",
                t.src,
                t.dst,
                t.also_to.len()
            ),
        ));
    }
}

/// The most masked padding slots one rank may allocate (`RankPlan::pad_slots`): 2³², the
/// longest a document may be. Padding rounds a rank's share up to whole chunks; more than a
/// whole document's worth is a hand-edited plan, and 2⁶³ of it overflowed sums.
pub const MAX_PAD_SLOTS: u64 = crate::trace::MAX_DOC_LEN;

/// The widest gradient element `scheme.params.grad_bytes` may name: fp64.
pub const MAX_GRAD_BYTES: u64 = 8;

/// Scheme parameters the simulator reads: `grad_bytes`, the bytes per element of the gradients
/// the scheme exchanges, must be a whole number from 1 to [`MAX_GRAD_BYTES`]. (Anything else
/// was silently replaced by the model's dtype, and 0 simulated free gradient traffic.)
fn check_params(plan: &Plan, out: &mut Vec<Violation>) {
    if let Some(g) = plan.scheme.params.get("grad_bytes") {
        if !g
            .as_u64()
            .is_some_and(|b| (1..=MAX_GRAD_BYTES).contains(&b))
        {
            out.push(v(
                ViolationKind::Header,
                format!(
                    "scheme.params.grad_bytes is {g}: it must be a whole number of bytes per gradient element from 1 to {MAX_GRAD_BYTES} (fp8 to fp64)"
                ),
            ));
        }
    }
}

fn check_ranges(plan: &Plan, out: &mut Vec<Violation>) {
    let docs = &plan.documents;
    let bad_range = |r: &TokenRange| -> bool {
        docs.get(r.doc as usize)
            .is_none_or(|d| r.start >= r.end || r.end > d.extent())
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
                    out.push(v(ViolationKind::BadRange, fmt_task(rp.rank, s, t)));
                }
            }
        }
    }
    for (rank, ranges) in plan.input_layout.iter().flatten().enumerate() {
        for r in ranges.iter().filter(|r| bad_range(r)) {
            out.push(v(
                ViolationKind::BadRange,
                format!("input_layout: rank {rank} holds {}", fmt_range(r)),
            ));
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
        if let Some(h) = t.heads.filter(|_| t.tensor == TransferTensor::Kv) {
            // A K/V head serves a whole GQA group of query heads, so a `kv` transfer moves
            // whole groups; a range inside one would read as fewer bytes in the simulator than
            // the executor moves, and as fewer heads held here than it delivers (bug hunt).
            let group = plan.q_heads.checked_div(plan.kv_heads).unwrap_or(0);
            if group > 1 && (h.start % group != 0 || h.end % group != 0) {
                let (lo, hi) = (h.start / group * group, h.end.div_ceil(group) * group);
                out.push(v(
                    ViolationKind::BadRange,
                    format!(
                        "transfer {} → {}: kv heads [{}, {}) split a GQA group of {group} query heads; a K/V transfer moves whole K/V heads, so its heads are [{lo}, {hi})",
                        t.src, t.dst, h.start, h.end
                    ),
                ));
            }
        }
    }
}

/// Per collective call, `(collective, kind)`, the step each member joins it at: the earliest
/// `issue_at` of a piece it sends or receives (the simulator's reading, `sim::program`). The
/// progress check runs the calls at these steps and the availability check asks for each
/// piece's data at its source's.
pub(super) fn call_joins(plan: &Plan) -> BTreeMap<(u32, super::TransferKind), BTreeMap<u32, u32>> {
    let mut joins: BTreeMap<(u32, super::TransferKind), BTreeMap<u32, u32>> = BTreeMap::new();
    for t in &plan.transfers {
        if let Some(call) = t.call() {
            let members = joins.entry(call).or_default();
            for r in std::iter::once(t.src).chain(t.receivers()) {
                let j = members.entry(r).or_insert(u32::MAX);
                *j = (*j).min(t.issue_at);
            }
        }
    }
    joins
}

/// Owner of each token, as `(start, end, rank)` runs per document indexed for overlap queries
/// (disjoint in a valid plan; [`check_partition`] reports where they are not).
pub(super) type OwnerMap = Vec<RunIndex<u32>>;

pub(super) fn owner_map(plan: &Plan) -> OwnerMap {
    layout_map(plan, plan.ranks.iter().map(|rp| rp.owned.as_slice()))
}

/// Input owner of each token ([`Plan::input_layout`]; `owned` when absent).
pub(super) fn input_owner_map(plan: &Plan) -> OwnerMap {
    layout_map(plan, (0..plan.ranks.len()).map(|r| plan.initial(r)))
}

fn layout_map<'a>(plan: &Plan, per_rank: impl Iterator<Item = &'a [TokenRange]>) -> OwnerMap {
    let mut map: Vec<Vec<(u64, u64, u32)>> = vec![Vec::new(); plan.documents.len()];
    for (rank, ranges) in per_rank.enumerate() {
        for r in ranges {
            map[r.doc as usize].push((r.start, r.end, rank as u32));
        }
    }
    map.into_iter().map(RunIndex::new).collect()
}

fn check_ownership(plan: &Plan, out: &mut Vec<Violation>) {
    check_partition(plan, &owner_map(plan), "", out);
    if plan.input_layout.is_some() {
        check_partition(plan, &input_owner_map(plan), "input_layout: ", out);
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

/// Every token of every document held by exactly one rank in `map`.
fn check_partition(plan: &Plan, map: &OwnerMap, what: &str, out: &mut Vec<Violation>) {
    for (doc, runs) in map.iter().enumerate() {
        let len = plan.documents[doc].extent();
        let mut pos = 0u64;
        for &(s, e, rank) in runs.runs() {
            if s < pos {
                out.push(v(
                    ViolationKind::OwnedTwice,
                    format!(
                        "{what}doc {doc} tokens [{s}, {}) owned twice (rank {rank} and another)",
                        pos.min(e)
                    ),
                ));
            } else if s > pos {
                out.push(v(
                    ViolationKind::NotOwned,
                    format!("{what}doc {doc} tokens [{pos}, {s}) owned by no rank"),
                ));
            }
            pos = pos.max(e);
        }
        if pos < len {
            out.push(v(
                ViolationKind::NotOwned,
                format!("{what}doc {doc} tokens [{pos}, {len}) owned by no rank"),
            ));
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
                            "{} computes no pair under the {} mask",
                            fmt_task(rp.rank, s, t),
                            plan.mask
                        ),
                    ));
                }
            }
        }
    }
}

/// Every rank has the same number of steps, as `docs/plan-format.md` defines the format: step
/// `s` is one phase of the whole group, and an `issue_at` past the last step means "after all
/// of the source's compute" — with uneven counts the same index would mean that on one rank
/// and a step on another. The builder pads every rank with trailing empty steps; a
/// hand-edited plan with a rank of 7 steps among ranks of 5 used to verify. One violation
/// names the first rank that differs from rank 0 and how many differ.
fn check_step_counts(plan: &Plan, out: &mut Vec<Violation>) {
    let Some(first) = plan.ranks.first() else {
        return;
    };
    let n = first.steps.len();
    let mut differ = plan.ranks.iter().filter(|rp| rp.steps.len() != n);
    if let Some(rp) = differ.next() {
        let more = differ.count();
        out.push(v(
            ViolationKind::StepCount,
            format!(
                "rank {} has {} steps, rank {} has {n}{}: every rank has the same number of \
                 steps (pad the shorter ranks with trailing empty steps)",
                rp.rank,
                rp.steps.len(),
                first.rank,
                if more > 0 {
                    format!(" ({more} more ranks differ from rank {})", first.rank)
                } else {
                    String::new()
                }
            ),
        ));
    }
}

fn check_congestion(plan: &Plan, out: &mut Vec<Violation>) {
    if !plan.congestion_free {
        return;
    }
    let mut sends: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    let mut recvs: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    // What the simulator runs as point-to-point messages (a `p2p` transfer with a stray
    // `collective` id included), one per delivery: a transfer with `also_to` receivers is
    // that many sends, as if listed once per receiver (bug hunt: it counted as one).
    for t in plan.transfers.iter().filter(|t| t.call().is_none()) {
        *sends.entry((t.round(), t.src)).or_default() += t.receiver_count();
        for dst in t.receivers() {
            *recvs.entry((t.round(), dst)).or_default() += 1;
        }
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
