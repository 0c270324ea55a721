//! Which transfers forward data their sender received, rather than data it held from the
//! start: a message of held data leaves as soon as its sender reaches its issue step, one that
//! forwards waits until the sender has everything that step needs (a ring hop). The simulator
//! times messages by it and the verifier's progress check follows the same rule, so both say
//! alike whether a plan can run to its end.

use super::{DocRuns, Plan, TransferTensor};

/// Per transfer of `plan`, in order: whether it forwards received data. An output return never
/// does (its sender computed it).
pub(crate) fn forwarding(plan: &Plan) -> Vec<bool> {
    // What each rank holds before any transfer: its input layout, or what it owns.
    let held: Vec<DocRuns<()>> = (0..plan.ranks.len())
        .map(|r| {
            DocRuns::new(
                plan.initial(r)
                    .iter()
                    .map(|o| (o.doc, o.start, o.end, ()))
                    .collect(),
            )
        })
        .collect();
    plan.transfers
        .iter()
        .map(|t| {
            t.tensor != TransferTensor::Out
                && !held.get(t.src as usize).is_some_and(|h| {
                    t.ranges
                        .iter()
                        .all(|r| h.get(r.doc).is_some_and(|runs| runs.covers(r.start, r.end)))
                })
        })
        .collect()
}
