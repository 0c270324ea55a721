//! A collective call's pieces are all filled before it runs, so no piece can send rows that
//! reach its rank only through the same call: delivered by the call to the rank itself, or to
//! another rank and brought on point to point. `fcp verify` refuses both (violation
//! `BadTransfer`); the replay found the rows missing, or hung.

use std::collections::{BTreeMap, BTreeSet};

use super::{fmt_range, v, Violation, ViolationKind};
use crate::hashing::FastMap;
use crate::plan::{DocRuns, HeadRange, Plan, TokenRange, TransferTensor};

/// Both checks, one call at a time.
pub(super) fn check_call_relays(plan: &Plan, out: &mut Vec<Violation>) {
    relayed_within_a_call(plan, out);
    relayed_through_a_hop(plan, out);
}

/// What a piece of a call sends of one document: `(start, end, heads, transfer)`.
type Piece = (u64, u64, HeadRange, usize);

/// A call, as `(id, kind)`.
type CallKey = (u32, crate::plan::TransferKind);

/// The pieces of each collective call.
fn calls_of(plan: &Plan) -> BTreeMap<CallKey, Vec<usize>> {
    let mut calls: BTreeMap<CallKey, Vec<usize>> = BTreeMap::new();
    for (i, t) in plan.transfers.iter().enumerate() {
        if let Some(call) = t.call() {
            calls.entry(call).or_default().push(i);
        }
    }
    calls
}

/// What each piece of a call sends, by (source, document, tensor): keyed by tensor too, as a
/// call that (wrongly) carries a rank's queries out and their outputs back relays nothing
/// (the progress check names that mix).
fn sends_of(plan: &Plan, pieces: &[usize]) -> FastMap<(u32, u32, TransferTensor), Vec<Piece>> {
    let all = HeadRange::from((0, plan.q_heads));
    let mut sends: FastMap<(u32, u32, TransferTensor), Vec<Piece>> = FastMap::default();
    for &i in pieces {
        let t = &plan.transfers[i];
        for r in &t.ranges {
            sends.entry((t.src, r.doc, t.tensor)).or_default().push((
                r.start,
                r.end,
                t.heads.unwrap_or(all),
                i,
            ));
        }
    }
    sends
}

/// Piece `j` of collective `id` sends `rows` it gets only through that call (`how`).
fn relayed(plan: &Plan, j: usize, id: u32, rows: &TokenRange, how: &str) -> Violation {
    let p = &plan.transfers[j];
    v(
        ViolationKind::BadTransfer,
        format!(
            "transfer {} → {}, a piece of collective {id}, sends {:?} of {} {how}: a call's pieces are filled before it runs",
            p.src,
            p.dst,
            p.tensor,
            fmt_range(rows)
        ),
    )
}

/// Whether two `(start, end, heads)` stretches of one document overlap.
fn overlap(a: (u64, u64, HeadRange), b: (u64, u64, HeadRange)) -> bool {
    a.0 < b.1 && b.0 < a.1 && a.2.start < b.2.end && b.2.start < a.2.end
}

/// No piece relays what the same call delivers to its source, unless the source holds those
/// rows anyway by the step it joins. Bug hunt: a piece sending on rows the call brought its
/// rank at the same step passed (its `arrive_by` made them held at the join step), and the
/// replay found them missing.
fn relayed_within_a_call(plan: &Plan, out: &mut Vec<Violation>) {
    let calls = calls_of(plan);
    let joins = super::call_joins(plan);
    let all = HeadRange::from((0, plan.q_heads));
    let none = BTreeSet::new();
    // One call at a time, its pieces' sources indexed by (rank, doc) and its deliveries read
    // against them as they stream by: an all-gather of 256 ranks delivers 15 million ranges,
    // too many to hold.
    for (key, pieces) in calls {
        let id = key.0;
        let sends = sends_of(plan, &pieces);
        let mut reported: BTreeSet<usize> = BTreeSet::new();
        for &i in &pieces {
            let t = &plan.transfers[i];
            let h = t.heads.unwrap_or(all);
            for dst in t.receivers() {
                for r in &t.ranges {
                    let Some(from) = sends.get(&(dst, r.doc, t.tensor)) else {
                        continue;
                    };
                    for &(a, b, g, j) in from {
                        let rows = TokenRange::new(r.doc, a.max(r.start), b.min(r.end));
                        let heads = HeadRange::from((g.start.max(h.start), g.end.min(h.end)));
                        let join = joins[&key][&dst];
                        if overlap((a, b, g), (r.start, r.end, h))
                            && !held_otherwise(plan, dst, rows, heads, t.tensor, join, key, &none)
                            && reported.insert(j)
                        {
                            let src = plan.transfers[j].src;
                            let how = format!("that the same call delivers to rank {src}");
                            out.push(relayed(plan, j, id, &rows, &how));
                        }
                    }
                }
            }
        }
    }
}

/// Where rows a call delivered have got to: `(rank, rows, heads, tensor, held from step,
/// rank the call delivered them to, whether a point-to-point hop brought them)`.
type Reached = (u32, TokenRange, HeadRange, TransferTensor, u32, u32, bool);

/// No piece sends rows that the same call delivers to another rank and point-to-point
/// transfers bring on to the piece's rank by the step it joins the call: the call waits for
/// the piece, the piece for the hops, the hops for the call. Bug hunt: such a plan passed
/// (the direct case was refused), and the replay hung on it. Calls are followed one at a
/// time, and only through the point-to-point transfers issued while the call's members join:
/// most plans have none, and the all-gather schemes' calls deliver millions of ranges.
fn relayed_through_a_hop(plan: &Plan, out: &mut Vec<Violation>) {
    let calls = calls_of(plan);
    let mut p2p: FastMap<u32, Vec<usize>> = FastMap::default();
    let mut p2p_steps: Vec<u32> = Vec::new();
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.call().is_none() {
            p2p.entry(t.src).or_default().push(i);
            p2p_steps.push(t.issue_at);
        }
    }
    if calls.is_empty() || p2p_steps.is_empty() {
        return;
    }
    p2p_steps.sort_unstable();
    let joins = super::call_joins(plan);
    let all = HeadRange::from((0, plan.q_heads));
    for (key, pieces) in calls {
        let members = &joins[&key];
        let lo = members.values().copied().min().unwrap_or(0);
        let hi = members.values().copied().max().unwrap_or(0);
        let k = p2p_steps.partition_point(|&x| x < lo);
        if p2p_steps.get(k).is_none_or(|&x| x > hi) {
            continue;
        }
        // What the call delivers to ranks that send point to point in its window.
        let mut queue: Vec<Reached> = Vec::new();
        // Outputs are followed by the output-flow check, whose circles pass through calls.
        for &i in pieces
            .iter()
            .filter(|&&i| plan.transfers[i].tensor != TransferTensor::Out)
        {
            let t = &plan.transfers[i];
            for dst in t.receivers().filter(|d| p2p.contains_key(d)) {
                for r in &t.ranges {
                    let h = t.heads.unwrap_or(all);
                    queue.push((dst, *r, h, t.tensor, t.arrive_by, dst, false));
                }
            }
        }
        if queue.is_empty() {
            continue;
        }
        let sends = sends_of(plan, &pieces);
        let mut seen: BTreeSet<(usize, u64, u64, u32, u32)> = BTreeSet::new();
        let mut reported: BTreeSet<usize> = BTreeSet::new();
        while let Some((rank, r, h, tensor, held, origin, hopped)) = queue.pop() {
            let join = members.get(&rank).copied();
            if hopped && join.is_some_and(|j| held <= j) {
                for &(a, b, g, j) in sends
                    .get(&(rank, r.doc, tensor))
                    .map_or(&[][..], Vec::as_slice)
                {
                    let rows = TokenRange::new(r.doc, a.max(r.start), b.min(r.end));
                    let heads = HeadRange::from((g.start.max(h.start), g.end.min(h.end)));
                    if overlap((a, b, g), (r.start, r.end, h))
                        && !held_otherwise(
                            plan,
                            rank,
                            rows,
                            heads,
                            tensor,
                            join.unwrap_or(0),
                            key,
                            &seen,
                        )
                        && reported.insert(j)
                    {
                        let how = format!(
                            "that reaches rank {rank} only through the same call (it delivers them to rank {origin}, and point-to-point transfers bring them on by step {held})"
                        );
                        out.push(relayed(plan, j, key.0, &rows, &how));
                    }
                }
            }
            for &j in p2p.get(&rank).map_or(&[][..], Vec::as_slice) {
                let t = &plan.transfers[j];
                if t.tensor != tensor || t.issue_at < held || t.issue_at > hi || t.arrive_by > hi {
                    continue;
                }
                let g = t.heads.unwrap_or(all);
                let heads = (h.start.max(g.start), h.end.min(g.end));
                if heads.0 >= heads.1 {
                    continue;
                }
                for x in t.ranges.iter().filter(|x| x.doc == r.doc) {
                    let (a, b) = (x.start.max(r.start), x.end.min(r.end));
                    if a < b && seen.insert((j, a, b, heads.0, heads.1)) {
                        for dst in t.receivers() {
                            let rows = TokenRange::new(r.doc, a, b);
                            let hr = HeadRange::from(heads);
                            queue.push((dst, rows, hr, tensor, t.arrive_by, origin, true));
                        }
                    }
                }
            }
        }
    }
}

/// Whether `rank` holds `rows` of `heads` by step `at` without call `call`: from the start,
/// or delivered by transfers that are neither the call's pieces nor the hops that carry on
/// what it delivers (`hops`: `(transfer, ...)`), head by head (two transfers of half the heads
/// each hold them all; bug hunt). A rank that already has the rows may send them in the call
/// and ignore the copy coming round. Outputs are never held otherwise: a piece hands over
/// what it holds.
#[allow(clippy::too_many_arguments)]
fn held_otherwise(
    plan: &Plan,
    rank: u32,
    rows: TokenRange,
    heads: HeadRange,
    tensor: TransferTensor,
    at: u32,
    call: CallKey,
    hops: &BTreeSet<(usize, u64, u64, u32, u32)>,
) -> bool {
    if tensor == TransferTensor::Out {
        return false;
    }
    let is_hop = |i: usize| {
        hops.range((i, 0, 0, 0, 0)..=(i, u64::MAX, u64::MAX, u32::MAX, u32::MAX))
            .next()
            .is_some()
    };
    let all = HeadRange::from((0, plan.q_heads));
    // What the rank holds, per head: its initial rows on every head, and what other
    // deliveries bring on theirs.
    let mut held: Vec<(u32, u64, u64, HeadRange)> = plan
        .initial(rank as usize)
        .iter()
        .filter(|o| o.doc == rows.doc)
        .map(|o| (o.doc, o.start, o.end, all))
        .collect();
    for (i, t) in plan.transfers.iter().enumerate() {
        if t.tensor == tensor
            && t.arrive_by <= at
            && t.call() != Some(call)
            && !is_hop(i)
            && t.receivers().any(|d| d == rank)
        {
            let g = t.heads.unwrap_or(all);
            held.extend(
                t.ranges
                    .iter()
                    .filter(|x| x.doc == rows.doc)
                    .map(|x| (x.doc, x.start, x.end, g)),
            );
        }
    }
    (heads.start..heads.end).all(|h| {
        let on_h: Vec<(u32, u64, u64, ())> = held
            .iter()
            .filter(|x| x.3.start <= h && h < x.3.end)
            .map(|x| (x.0, x.1, x.2, ()))
            .collect();
        DocRuns::new(on_h)
            .get(rows.doc)
            .is_some_and(|runs| runs.covers(rows.start, rows.end))
    })
}
