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
/// rank, sums stay inside `u64` nanoseconds (6.6·10¹⁸ of 1.8·10¹⁹). A layer's token-linear
/// work and a collective are held to it too ([`super::layer::LayerCost::ns`],
/// [`super::network::CollectiveModel::ring_ns_over`]).
pub(crate) const MAX_STEP_NS: f64 = 1e14;

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

/// [`bytes_of`] each transfer of `plan`, in order.
pub(super) fn bytes_each(plan: &Plan, model: &Model) -> Vec<u64> {
    plan.transfers
        .iter()
        .map(|t| bytes_of(t, plan, model))
        .collect()
}

/// A flow or collective piece in a pass, before grouping.
struct Piece {
    kind: TransferKind,
    /// The call it belongs to: the plan's id, or for a gradient's call the plan's id with
    /// bit 32 set (bug hunt: `id + 2³⁰` ran into the plan's own ids from 2³⁰ on).
    collective: Option<u64>,
    src: u32,
    dst: u32,
    bytes: u64,
    issue_at: u32,
    need_by: Option<u32>,
    forwards: bool,
    /// A gradient (dQ, dK/dV): its sender's contribution to a collective call is ready only
    /// once every gradient it sends in that call is, so it joins at the latest of them.
    gradient: bool,
}

/// The call a gradient of collective `c` goes back in: ids of their own, apart from every
/// id a plan can give (`u32`).
fn grad_call(c: u32) -> u64 {
    u64::from(c) | 1 << 32
}

/// Flows, and collective calls summed per member as their pieces stream by: an all-gather at
/// 2,048 ranks has 4 million pieces (8 million with its gradient), and holding them all to
/// sum them afterwards was most of a 2,048-rank Llama3 CP simulation's memory.
fn group(pieces: impl IntoIterator<Item = Piece>) -> (Vec<Flow>, Vec<CollectiveOp>) {
    let mut flows = Vec::new();
    let mut calls: BTreeMap<(u64, TransferKind), Call> = BTreeMap::new();
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
            (k, Some(id)) => calls.entry((id, k)).or_default().add(&p),
        }
    }
    let collectives = calls
        .into_iter()
        .map(|((_, kind), call)| call.finish(kind))
        .collect();
    (flows, collectives)
}

/// One member of a collective call, summed over the call's pieces.
#[derive(Clone, Copy)]
struct Member {
    /// Earliest `issue_at` of a piece it sends or receives.
    issue_at: u32,
    /// Latest `issue_at` of a gradient it sends: when it has one, the member joins then, not
    /// at `issue_at` (bug hunt: a K/V shard that no step read had its zero dK/dV "done" at
    /// its arrival, so Llama3 CP's reduce-scatter ran beside the backward compute that
    /// produced the rest of it; 16 ranks of a wlb-llm batch, backward 22.04 → 30.57 ms).
    ready: Option<u32>,
    /// Earliest `need_by` of a piece it receives.
    need_by: Option<u32>,
    sent: u64,
    recv: u64,
}

impl Default for Member {
    fn default() -> Self {
        Member {
            issue_at: u32::MAX,
            ready: None,
            need_by: None,
            sent: 0,
            recv: 0,
        }
    }
}

/// A collective call's pieces, summed per member (ranks in order).
#[derive(Default)]
struct Call {
    members: BTreeMap<u32, Member>,
    largest_piece: u64,
}

impl Call {
    fn add(&mut self, p: &Piece) {
        let s = self.members.entry(p.src).or_default();
        if p.gradient {
            s.ready = Some(s.ready.map_or(p.issue_at, |r| r.max(p.issue_at)));
        } else {
            s.issue_at = s.issue_at.min(p.issue_at);
        }
        s.sent += p.bytes;
        let d = self.members.entry(p.dst).or_default();
        d.issue_at = d.issue_at.min(p.issue_at);
        if let Some(nb) = p.need_by {
            d.need_by = Some(d.need_by.map_or(nb, |x| x.min(nb)));
        }
        d.recv += p.bytes;
        self.largest_piece = self.largest_piece.max(p.bytes);
    }

    fn finish(self, kind: TransferKind) -> CollectiveOp {
        let n = self.members.len();
        let largest_piece = self.largest_piece;
        let (members, m): (Vec<u32>, Vec<Member>) = self.members.into_iter().unzip();
        let issue_at: Vec<u32> = m.iter().map(|x| x.ready.unwrap_or(x.issue_at)).collect();
        let need_by: Vec<Option<u32>> = m.iter().map(|x| x.need_by).collect();
        let sent: Vec<u64> = m.iter().map(|x| x.sent).collect();
        let recv: Vec<u64> = m.iter().map(|x| x.recv).collect();
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
}

impl Program {
    /// Nanoseconds the busiest NIC direction of any rank spends on this pass's own traffic:
    /// the bytes each rank sends and receives across nodes (a message to another node;
    /// every piece of a collective whose members span nodes) at the NIC's speed. What a
    /// collective of data parallelism or ZeRO 3 that overlaps the pass must share the NICs
    /// with ([`super::step::step_metrics`], [`super::layer::LayerPass::wait_for_weights`]).
    pub fn nic_busy_ns(&self, net: &super::network::Network) -> u64 {
        net.nic_ns(self.nic_busiest_bytes(net))
    }

    /// Bytes through the busiest NIC direction of any rank.
    fn nic_busiest_bytes(&self, net: &super::network::Network) -> u64 {
        let mut sent: BTreeMap<u32, u64> = BTreeMap::new();
        let mut recv: BTreeMap<u32, u64> = BTreeMap::new();
        for f in self.flows.iter().filter(|f| !net.same_node(f.src, f.dst)) {
            *sent.entry(f.src).or_default() += f.bytes;
            *recv.entry(f.dst).or_default() += f.bytes;
        }
        for c in &self.collectives {
            let first = c.members.first().copied().unwrap_or(0);
            if c.members.iter().all(|&m| net.same_node(m, first)) {
                continue;
            }
            for (i, &m) in c.members.iter().enumerate() {
                *sent.entry(m).or_default() += c.sent[i];
                *recv.entry(m).or_default() += c.recv[i];
            }
        }
        sent.values()
            .chain(recv.values())
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// The forward pass exactly as planned.
    pub fn forward(
        plan: &Plan,
        idx: &PlanIndex,
        model: &Model,
        cm: &mut ComputeModel<'_>,
    ) -> Result<Program, HardwareError> {
        let steps = step_costs(plan, cm, Pass::Fwd)?;
        // Whether the source sends Q or K/V it does not hold from the start (so the send waits
        // for it to arrive); worked out once per transfer, not per receiver.
        let (bytes, forwards) = (bytes_each(plan, model), idx.forwards());
        let pieces = plan.deliveries().map(|d| {
            let t = d.transfer;
            Piece {
                kind: t.kind,
                collective: t.collective.map(u64::from),
                src: t.src,
                dst: d.dst,
                bytes: bytes[d.index],
                issue_at: t.issue_at,
                need_by: (t.tensor != TransferTensor::Out).then_some(t.arrive_by),
                forwards: forwards[d.index],
                gradient: false,
            }
        });
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
        // Whether the source sends Q or K/V it does not hold from the start (so the send waits
        // for it to arrive); worked out once per transfer, not per receiver.
        let (bytes, forwards) = (bytes_each(plan, model), idx.forwards());
        // Per delivery, in plan order: the input again and its gradient back, or dO.
        let pieces = plan.deliveries().enumerate().flat_map(|(d, dl)| {
            let (t, i) = (dl.transfer, dl.index);
            match t.tensor {
                TransferTensor::Kv | TransferTensor::Q => {
                    let again = Piece {
                        kind: t.kind,
                        collective: t.collective.map(u64::from),
                        src: t.src,
                        dst: dl.dst,
                        bytes: bytes[i],
                        issue_at: t.issue_at,
                        need_by: Some(t.arrive_by),
                        forwards: forwards[i],
                        gradient: false,
                    };
                    let done = idx.use_steps(d).map_or(t.arrive_by, |(_, last)| last + 1);
                    let kind = match t.kind {
                        TransferKind::AllGather => TransferKind::ReduceScatter,
                        k => k,
                    };
                    let grad = Piece {
                        kind,
                        // Gradient collectives get ids of their own.
                        collective: t.collective.map(grad_call),
                        src: dl.dst,
                        dst: t.src,
                        bytes: grad_bytes_of(bytes[i], model, gb),
                        issue_at: done,
                        need_by: None,
                        forwards: false,
                        gradient: true,
                    };
                    [Some(again), Some(grad)]
                }
                TransferTensor::Out => {
                    let first = idx.use_steps(d).map_or(0, |(first, _)| first);
                    let d_out = Piece {
                        kind: t.kind,
                        collective: t.collective.map(grad_call),
                        src: dl.dst,
                        dst: t.src,
                        bytes: bytes[i],
                        issue_at: 0,
                        need_by: Some(first),
                        forwards: false,
                        gradient: false,
                    };
                    [Some(d_out), None]
                }
            }
            .into_iter()
            .flatten()
        });
        let (flows, collectives) = group(pieces);
        Ok(Program {
            pass: Pass::Bwd,
            steps,
            flows,
            collectives,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::network::Network;

    /// The busiest NIC direction: messages between nodes count at both ends, messages inside
    /// a node not at all, and a collective spanning nodes with every piece.
    #[test]
    fn nic_busy_time_counts_what_crosses_nodes_at_its_busiest_end() {
        let net = Network::custom(2, 100.0, 10.0, 0, 0);
        let flow = |src, dst, bytes| Flow {
            src,
            dst,
            bytes,
            issue_at: 0,
            need_by: Some(1),
            forwards: false,
        };
        let mut p = Program {
            pass: Pass::Bwd,
            steps: vec![Vec::new(); 4],
            // Rank 0 sends 3 MB across (to 2 and 3), 1 MB inside its node (to 1).
            flows: vec![
                flow(0, 2, 2_000_000),
                flow(0, 3, 1_000_000),
                flow(0, 1, 1_000_000),
            ],
            collectives: Vec::new(),
        };
        // 3 MB at 10 GB/s: 0.3 ms.
        assert_eq!(p.nic_busy_ns(&net), 300_000);
        let coll = |members: Vec<u32>, bytes| CollectiveOp {
            kind: CollectiveKind::AllGather,
            issue_at: vec![0; members.len()],
            need_by: vec![Some(1); members.len()],
            sent: vec![bytes; members.len()],
            recv: vec![bytes; members.len()],
            size_bytes: bytes,
            members,
        };
        // Inside node 1: nothing; across nodes: rank 2 receives 2 MB + 2.5 MB.
        p.collectives = vec![coll(vec![2, 3], 9_000_000), coll(vec![1, 2], 2_500_000)];
        assert_eq!(p.nic_busy_ns(&net), 450_000);
        p.flows.clear();
        p.collectives.clear();
        assert_eq!(p.nic_busy_ns(&net), 0);
    }
}
