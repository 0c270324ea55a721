//! Exact-cover check: every pair the mask allows is computed exactly once per query head.

use std::collections::BTreeSet;

use super::{v, Violation, ViolationKind};
use crate::plan::{HeadRange, Plan, Task};

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
pub(super) fn check_coverage(plan: &Plan, out: &mut Vec<Violation>) {
    const MAX_REPORTS_PER_DOC: usize = 4;
    let segments = head_segments(plan);
    for (doc, tasks) in tasks_by_doc(plan).iter().enumerate() {
        let len = plan.documents[doc].extent();
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
