//! What the engine runs: per-rank step costs, point-to-point flows and collective calls, for
//! one pass. The forward program is read straight off the plan; the backward program is derived
//! from the same plan by [`Program::backward`], the one function every scheme's backward pass
//! goes through, so all schemes are costed alike.

use std::collections::BTreeMap;

use crate::hardware::{HardwareError, Pass};
use crate::model::Model;
use crate::plan::{transfer_bytes, Plan, Transfer, TransferKind, TransferTensor};

use super::compute::ComputeModel;
use super::index::PlanIndex;

/// Compute of one step on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCost {
    /// Duration in nanoseconds (tiles plus one launch overhead when the step has work).
    pub ns: u64,
    /// FLOPs of the step.
    pub flops: f64,
}

/// A point-to-point message.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// Sender.
    pub src: u32,
    /// Receiver.
    pub dst: u32,
    /// Payload bytes.
    pub bytes: u64,
    /// Issued when `src` starts this step (past its last step: when its compute is done).
    pub issue_at: u32,
    /// `dst` cannot start this step before the flow lands; `None`: needed only by the end.
    pub need_by: Option<u32>,
    /// The message forwards data `src` itself received (a ring hop), so it can only leave once
    /// `src` has everything its step `issue_at` needs; otherwise it leaves as soon as `src` is
    /// ready for that step.
    pub forwards: bool,
}

/// Collective algorithm families the engine costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// Ring all-gather.
    AllGather,
    /// Ring reduce-scatter.
    ReduceScatter,
    /// Pairwise all-to-all.
    AllToAll,
}

/// One collective call: every member joins when it reaches `issue_at`; the call runs once all
/// have joined and ends for all members at once.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveOp {
    /// Algorithm.
    pub kind: CollectiveKind,
    /// Ranks taking part, sorted.
    pub members: Vec<u32>,
    /// Per member (same order): the step at whose start it joins.
    pub issue_at: Vec<u32>,
    /// Per member: the step that waits for the result (`None`: only the end does).
    pub need_by: Vec<Option<u32>>,
    /// Per member: bytes sent and received.
    pub sent: Vec<u64>,
    /// Per member: bytes received.
    pub recv: Vec<u64>,
    /// Size nccl-tests would report for the call: the gathered output for all-gather, the
    /// input for reduce-scatter (both padded to the largest member's share, as equal-size
    /// collectives require); the largest per-member volume for all-to-all.
    pub size_bytes: u64,
}

/// Everything one pass runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Pass this program models.
    pub pass: Pass,
    /// Per rank, per step.
    pub steps: Vec<Vec<StepCost>>,
    /// Point-to-point flows.
    pub flows: Vec<Flow>,
    /// Collective calls.
    pub collectives: Vec<CollectiveOp>,
}

/// Bytes per element of the gradients a scheme exchanges: `scheme.params.grad_bytes` when the
/// scheme sets it (ring-flash-attention accumulates and passes dK/dV in fp32), else the model
/// dtype.
pub fn grad_bytes(plan: &Plan, model: &Model) -> u64 {
    plan.scheme
        .params
        .get("grad_bytes")
        .and_then(|v| v.as_u64())
        .unwrap_or(model.dtype_bytes as u64)
}

/// The longest step the simulator times (10⁵ s, about a day): with at most 65,536 steps per
/// rank, sums stay inside `u64` nanoseconds (6.6·10¹⁸ of 1.8·10¹⁹).
const MAX_STEP_NS: f64 = 1e14;

fn step_costs(
    plan: &Plan,
    cm: &mut ComputeModel<'_>,
    pass: Pass,
) -> Result<Vec<Vec<StepCost>>, HardwareError> {
    plan.ranks
        .iter()
        .map(|rp| {
            rp.steps
                .iter()
                .map(|st| {
                    let c = cm.step(plan, &st.tasks, pass)?;
                    // Times are integer nanoseconds; a step this long (a hand-made plan of a
                    // trillion-token document) would overflow the timeline's sums.
                    if c.seconds.is_nan() || c.seconds * 1e9 >= MAX_STEP_NS {
                        return Err(HardwareError::InvalidQuery(format!(
                            "a {pass} step of rank {} would take {:.3e} s, beyond the {:.0e} s one step may take in the simulator; no real batch comes near",
                            rp.rank,
                            c.seconds,
                            MAX_STEP_NS / 1e9
                        )));
                    }
                    Ok(StepCost {
                        ns: (c.seconds * 1e9).round() as u64,
                        flops: c.flops,
                    })
                })
                .collect()
        })
        .collect()
}

pub(super) fn bytes_of(t: &Transfer, plan: &Plan, model: &Model) -> u64 {
    transfer_bytes(
        t.tensor,
        t.tokens(),
        t.heads.map(|h| (h.start, h.end)),
        plan,
        model,
    )
}

/// Bytes of the gradient of what a transfer of `bytes` carried (dK/dV for K/V, dQ for Q), in
/// `gb`-byte elements.
fn grad_bytes_of(bytes: u64, model: &Model, gb: u64) -> u64 {
    bytes / model.dtype_bytes.max(1) as u64 * gb
}

/// Per transfer of `plan`: its bytes, and whether its source sends Q or K/V it does not hold
/// from the start (so the send waits for it to arrive). Worked out once per transfer, not once
/// per receiver: an all-gather's shard reaches N − 1 ranks.
fn per_transfer(plan: &Plan, idx: &PlanIndex, model: &Model) -> (Vec<u64>, Vec<bool>) {
    plan.transfers
        .iter()
        .map(|t| {
            let forwards =
                t.tensor != TransferTensor::Out && !idx.holds_initially(t.src, &t.ranges);
            (bytes_of(t, plan, model), forwards)
        })
        .unzip()
}

/// A flow or collective piece in a pass, before grouping.
struct Piece {
    kind: TransferKind,
    collective: Option<u32>,
    src: u32,
    dst: u32,
    bytes: u64,
    issue_at: u32,
    need_by: Option<u32>,
    forwards: bool,
}

fn group(pieces: Vec<Piece>) -> (Vec<Flow>, Vec<CollectiveOp>) {
    let mut flows = Vec::new();
    let mut calls: BTreeMap<(u32, TransferKind), Vec<Piece>> = BTreeMap::new();
    for p in pieces {
        match (p.kind, p.collective) {
            (TransferKind::P2p, _) | (_, None) => flows.push(Flow {
                src: p.src,
                dst: p.dst,
                bytes: p.bytes,
                issue_at: p.issue_at,
                need_by: p.need_by,
                forwards: p.forwards,
            }),
            (k, Some(id)) => calls.entry((id, k)).or_default().push(p),
        }
    }
    let collectives = calls
        .into_iter()
        .map(|((_, kind), ps)| collective(kind, &ps))
        .collect();
    (flows, collectives)
}

fn collective(kind: TransferKind, ps: &[Piece]) -> CollectiveOp {
    let mut members: Vec<u32> = ps.iter().flat_map(|p| [p.src, p.dst]).collect();
    members.sort_unstable();
    members.dedup();
    let idx = |r: u32| members.binary_search(&r).unwrap_or(0);
    let n = members.len();
    let mut issue_at = vec![u32::MAX; n];
    let mut need_by: Vec<Option<u32>> = vec![None; n];
    let mut sent = vec![0u64; n];
    let mut recv = vec![0u64; n];
    let mut largest_piece = 0u64;
    for p in ps {
        let (s, d) = (idx(p.src), idx(p.dst));
        issue_at[s] = issue_at[s].min(p.issue_at);
        issue_at[d] = issue_at[d].min(p.issue_at);
        if let Some(nb) = p.need_by {
            need_by[d] = Some(need_by[d].map_or(nb, |x| x.min(nb)));
        }
        sent[s] += p.bytes;
        recv[d] += p.bytes;
        largest_piece = largest_piece.max(p.bytes);
    }
    let kind = match kind {
        TransferKind::AllGather => CollectiveKind::AllGather,
        TransferKind::ReduceScatter => CollectiveKind::ReduceScatter,
        _ => CollectiveKind::AllToAll,
    };
    let size_bytes = match kind {
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => n as u64 * largest_piece,
        CollectiveKind::AllToAll => sent.iter().chain(&recv).copied().max().unwrap_or(0),
    };
    CollectiveOp {
        kind,
        members,
        issue_at,
        need_by,
        sent,
        recv,
        size_bytes,
    }
}

impl Program {
    /// The forward pass exactly as planned.
    pub fn forward(
        plan: &Plan,
        idx: &PlanIndex,
        model: &Model,
        cm: &mut ComputeModel<'_>,
    ) -> Result<Program, HardwareError> {
        let steps = step_costs(plan, cm, Pass::Fwd)?;
        let (bytes, forwards) = per_transfer(plan, idx, model);
        let pieces = plan
            .deliveries()
            .map(|d| {
                let t = d.transfer;
                Piece {
                    kind: t.kind,
                    collective: t.collective,
                    src: t.src,
                    dst: d.dst,
                    bytes: bytes[d.index],
                    issue_at: t.issue_at,
                    need_by: (t.tensor != TransferTensor::Out).then_some(t.arrive_by),
                    forwards: t.tensor != TransferTensor::Out && forwards[d.index],
                }
            })
            .collect();
        let (flows, collectives) = group(pieces);
        Ok(Program {
            pass: Pass::Fwd,
            steps,
            flows,
            collectives,
        })
    }

    /// The backward pass derived from the forward plan — the same for every scheme:
    ///
    /// * every step runs again with backward throughput and 2.5× the FLOPs;
    /// * every Q or K/V transfer happens again with the same timing (the inputs are needed
    ///   again), and the gradient of what it carried (dQ, or dK/dV in the scheme's gradient
    ///   dtype) goes back along the reverse edge once the receiver's last step that used it is
    ///   done — for a ring this is the per-hop dK/dV pass, for a multicast the return to the
    ///   owner; an all-gather's gradient is a reduce-scatter over the same group;
    /// * every output return becomes the reverse delivery of dO (with the forward output's
    ///   size), needed before the first step that computes those queries.
    pub fn backward(
        plan: &Plan,
        idx: &PlanIndex,
        model: &Model,
        cm: &mut ComputeModel<'_>,
    ) -> Result<Program, HardwareError> {
        let steps = step_costs(plan, cm, Pass::Bwd)?;
        let gb = grad_bytes(plan, model);
        let (bytes, forwards) = per_transfer(plan, idx, model);
        let mut pieces = Vec::new();
        for (d, dl) in plan.deliveries().enumerate() {
            let (t, i) = (dl.transfer, dl.index);
            match t.tensor {
                TransferTensor::Kv | TransferTensor::Q => {
                    pieces.push(Piece {
                        kind: t.kind,
                        collective: t.collective,
                        src: t.src,
                        dst: dl.dst,
                        bytes: bytes[i],
                        issue_at: t.issue_at,
                        need_by: Some(t.arrive_by),
                        forwards: forwards[i],
                    });
                    let done = idx.use_steps(d).map_or(t.arrive_by, |(_, last)| last + 1);
                    let kind = match t.kind {
                        TransferKind::AllGather => TransferKind::ReduceScatter,
                        k => k,
                    };
                    pieces.push(Piece {
                        kind,
                        // Gradient collectives get ids of their own.
                        collective: t.collective.map(|c| c + (1 << 30)),
                        src: dl.dst,
                        dst: t.src,
                        bytes: grad_bytes_of(bytes[i], model, gb),
                        issue_at: done,
                        need_by: None,
                        forwards: false,
                    });
                }
                TransferTensor::Out => {
                    let first = idx.use_steps(d).map_or(0, |(first, _)| first);
                    pieces.push(Piece {
                        kind: t.kind,
                        collective: t.collective.map(|c| c + (1 << 30)),
                        src: dl.dst,
                        dst: t.src,
                        bytes: bytes[i],
                        issue_at: 0,
                        need_by: Some(first),
                        forwards: false,
                    });
                }
            }
        }
        let (flows, collectives) = group(pieces);
        Ok(Program {
            pass: Pass::Bwd,
            steps,
            flows,
            collectives,
        })
    }
}
