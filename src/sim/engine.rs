//! The event-driven engine: runs one [`Program`] on the network in integer nanoseconds.
//!
//! Each rank has a compute stream that runs its steps in order. When a rank is ready for step
//! `s` (step `s − 1` is done) it issues the messages and joins the collectives the plan issues
//! at `s` whose data it owns; the step itself starts once every input it needs has landed, and
//! messages that forward data received for that step are issued then. Messages pay their
//! link's latency, then share ports max-min fairly until they drain. A collective starts when
//! its last member joins and ends for all members at once.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::network::{CollectiveModel, FairShare, Network};
use super::program::Program;
use super::{waits, SimError};

/// Messages that would finish within this many nanoseconds of the earliest one finish with it.
/// Merging near-simultaneous completions saves a rate recomputation each (the dominant cost on
/// plans with hundreds of concurrent messages) and moves no finish time by more than this —
/// small against the microsecond latencies and millisecond steps being modelled.
const COMPLETION_SLACK_NS: f64 = 200.0;

/// What one rank did during one pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RankOutcome {
    /// Time its compute stream was busy.
    pub compute_ns: u64,
    /// Time its compute stream waited for data (before a step, and after its last step until
    /// its own messages were done).
    pub exposed_ns: u64,
    /// The part of `exposed_ns` during which none of its messages or collectives was in
    /// flight: it waited on a peer still computing ([`super::waits`]).
    pub waiting_on_peers_ns: u64,
    /// Time during which at least one of its messages or collectives was in flight.
    pub comm_ns: u64,
    /// When its last compute or communication ended.
    pub finish_ns: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_recv: u64,
    /// FLOPs computed.
    pub flops: f64,
    /// When its last step ended (its start, if it has no step).
    pub compute_end_ns: u64,
    /// When the last message or collective result it receives landed (0 if none): with
    /// `compute_end_ns`, when its attention output is complete.
    pub inputs_done_ns: u64,
}

/// Result of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct PassOutcome {
    /// Per rank.
    pub ranks: Vec<RankOutcome>,
    /// When the last rank finished.
    pub end_ns: u64,
    /// Per rank: when each step ran and when its transfers were in flight (for Gantt charts).
    pub timeline: Vec<RankTimeline>,
}

/// What one rank did when, in nanoseconds from the start of the pass: intervals `(start, end)`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RankTimeline {
    /// Steps on the compute stream, in order.
    pub compute: Vec<(u64, u64)>,
    /// Messages it sent and collectives it took part in, from issue to arrival.
    pub send: Vec<(u64, u64)>,
    /// Messages it received and collectives it took part in, from issue to arrival.
    pub recv: Vec<(u64, u64)>,
    /// Token-linear work (projections, MLP) on the compute stream: empty but in a whole-layer
    /// run ([`super::layer`]), where it is the work before and after attention.
    pub linear: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlowState {
    Waiting,
    Latency,
    Active,
    Done,
}

struct FlowRt {
    state: FlowState,
    remaining: f64,
    rate: f64,
    issued: u64,
    done: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    StepEnd(u32),
    CollEnd(usize),
    FlowActive(usize),
    /// A rank's compute stream becomes free for its first step (`start_ns` of [`run`]).
    Start(u32),
    /// The earliest active flow finishes. Kept out of the heap, in one slot (`done_at`): only
    /// the latest epoch's is live, and the heap used to fill with stale ones (a fifth of a
    /// 4096-rank simulation went to popping them). The last variant, so at equal times it
    /// follows every heap event, as it did in the heap.
    FlowsDone(u64),
}

struct RankRt {
    nsteps: u32,
    /// Next step to run (== nsteps once all are done).
    next: u32,
    running: bool,
    ready_at: u64,
    /// Inputs still missing per step, and at index `nsteps` those due past the last step (the
    /// end waits for them: forwards issued there leave once they are in, as in the replay).
    pending: Vec<u32>,
    compute_end: u64,
    done: bool,
}

/// Run `p` on `net`; collectives are timed by `coll`. `start_ns`: per rank, when its compute
/// stream is first free for the pass (empty: every rank at 0). The whole-layer simulation
/// ([`super::layer`]) puts the token-linear work before attention there, so a rank with more
/// tokens starts its attention, and sends its own K/V, later.
pub fn run(
    p: &Program,
    start_ns: &[u64],
    net: &Network,
    coll: &CollectiveModel<'_>,
) -> Result<PassOutcome, SimError> {
    let n = p.steps.len();
    let start = |r: usize| start_ns.get(r).copied().unwrap_or(0);
    // A rank that starts later is busy until then (with the work before its attention).
    let mut ranks: Vec<RankRt> = p
        .steps
        .iter()
        .enumerate()
        .map(|(r, st)| RankRt {
            nsteps: st.len() as u32,
            next: 0,
            running: start(r) > 0,
            ready_at: start(r),
            pending: vec![0; st.len() + 1],
            compute_end: start(r),
            done: false,
        })
        .collect();
    let need = |rank: usize, nb: Option<u32>, ranks: &[RankRt]| -> Option<usize> {
        nb.map(|s| s.min(ranks[rank].nsteps) as usize)
    };
    // Index flows by (src, issue step) and count inputs per (dst, step).
    let mut issue_owned: Vec<Vec<Vec<usize>>> = ranks
        .iter()
        .map(|r| vec![Vec::new(); r.nsteps as usize + 1])
        .collect();
    let mut issue_fwd: Vec<Vec<Vec<usize>>> = issue_owned.clone();
    for (i, f) in p.flows.iter().enumerate() {
        let r = &ranks[f.src as usize];
        let s = f.issue_at.min(r.nsteps) as usize;
        if f.forwards {
            issue_fwd[f.src as usize][s].push(i);
        } else {
            issue_owned[f.src as usize][s].push(i);
        }
        if let Some(s) = need(f.dst as usize, f.need_by, &ranks) {
            ranks[f.dst as usize].pending[s] += 1;
        }
    }
    let mut joins: Vec<Vec<Vec<usize>>> = ranks
        .iter()
        .map(|r| vec![Vec::new(); r.nsteps as usize + 1])
        .collect();
    let mut coll_missing: Vec<usize> = Vec::with_capacity(p.collectives.len());
    let mut coll_dur = Vec::with_capacity(p.collectives.len());
    for (c, op) in p.collectives.iter().enumerate() {
        for (m, &r) in op.members.iter().enumerate() {
            let s = op.issue_at[m].min(ranks[r as usize].nsteps) as usize;
            joins[r as usize][s].push(c);
            if let Some(s) = need(r as usize, op.need_by[m], &ranks) {
                ranks[r as usize].pending[s] += 1;
            }
        }
        coll_missing.push(op.members.len());
        coll_dur.push(coll.duration_ns(op)?);
    }
    let mut coll_span: Vec<(u64, u64)> = vec![(0, 0); p.collectives.len()];

    let mut flows: Vec<FlowRt> = p
        .flows
        .iter()
        .map(|f| FlowRt {
            state: FlowState::Waiting,
            remaining: f.bytes as f64,
            rate: 0.0,
            issued: 0,
            done: 0,
        })
        .collect();
    let mut out: Vec<RankOutcome> = vec![RankOutcome::default(); n];
    let mut timeline: Vec<RankTimeline> = vec![RankTimeline::default(); n];
    let mut heap: BinaryHeap<Reverse<(u64, Ev)>> = BinaryHeap::new();
    let mut active: Vec<usize> = Vec::new();
    let mut last_rate_update = 0u64;
    let mut active_changed = false;
    let mut epoch = 0u64;
    // When the current epoch's earliest active flow finishes (see `Ev::FlowsDone`).
    let mut done_at: Option<u64> = None;
    let flow_ports: Vec<[usize; 2]> = p.flows.iter().map(|f| net.ports(f.src, f.dst)).collect();
    let mut fair = FairShare::new(4 * n);
    let mut ports: Vec<[usize; 2]> = Vec::new();
    // Ports of the flows that started or finished since the rates were last set: only the
    // flows connected to them through shared ports can change rate (max-min fairness splits
    // over connected components), so only those are recomputed.
    let mut touched = PortSet::new(4 * n);
    let mut component: Vec<usize> = Vec::new();

    // Ranks whose readiness must be re-examined at the current instant.
    let mut dirty: Vec<u32> = (0..n as u32).filter(|&r| start(r as usize) == 0).collect();
    for r in (0..n).filter(|&r| start(r) > 0) {
        heap.push(Reverse((start(r), Ev::Start(r as u32))));
    }
    let mut now = 0u64;
    loop {
        // Settle every rank at `now`: issue, join, start steps, until nothing changes.
        while let Some(r) = dirty.pop() {
            let ru = r as usize;
            if ranks[ru].running || ranks[ru].done {
                continue;
            }
            let s = ranks[ru].next;
            let su = s as usize;
            // Issue owned-data messages and join collectives for step s (once).
            for i in std::mem::take(&mut issue_owned[ru][su]) {
                issue_flow(i, now, p, net, &mut flows, &mut heap);
            }
            for c in std::mem::take(&mut joins[ru][su]) {
                coll_missing[c] -= 1;
                if coll_missing[c] == 0 {
                    coll_span[c] = (now, now + coll_dur[c]);
                    heap.push(Reverse((now + coll_dur[c], Ev::CollEnd(c))));
                }
            }
            if s == ranks[ru].nsteps {
                // The end: forwards issued past the last step leave once everything due to
                // the rank is in (bug hunt: they left at once, so a circle of them passed).
                if ranks[ru].pending[su] == 0 {
                    for i in std::mem::take(&mut issue_fwd[ru][su]) {
                        issue_flow(i, now, p, net, &mut flows, &mut heap);
                    }
                    ranks[ru].done = true;
                    ranks[ru].compute_end = ranks[ru].ready_at;
                }
                continue;
            }
            if ranks[ru].pending[su] == 0 {
                out[ru].exposed_ns += now - ranks[ru].ready_at;
                for i in std::mem::take(&mut issue_fwd[ru][su]) {
                    issue_flow(i, now, p, net, &mut flows, &mut heap);
                }
                let cost = p.steps[ru][su];
                out[ru].compute_ns += cost.ns;
                out[ru].flops += cost.flops;
                timeline[ru].compute.push((now, now + cost.ns));
                ranks[ru].running = true;
                heap.push(Reverse((now + cost.ns, Ev::StepEnd(r))));
            }
        }
        // Events at `now`.
        let from_heap = heap.peek().map(|&Reverse(x)| x);
        let next = match (from_heap, done_at) {
            (Some((t, ev)), Some(d)) if t <= d => Some((t, ev)),
            (_, Some(d)) => Some((d, Ev::FlowsDone(epoch))),
            (h, None) => h,
        };
        if let Some((t, ev)) = next {
            if t == now {
                if matches!(ev, Ev::FlowsDone(_)) {
                    done_at = None;
                } else {
                    heap.pop();
                }
                match ev {
                    Ev::StepEnd(r) => {
                        let rr = &mut ranks[r as usize];
                        rr.running = false;
                        rr.next += 1;
                        rr.ready_at = now;
                        dirty.push(r);
                    }
                    Ev::Start(r) => {
                        ranks[r as usize].running = false;
                        dirty.push(r);
                    }
                    Ev::CollEnd(c) => {
                        let op = &p.collectives[c];
                        for (m, &r) in op.members.iter().enumerate() {
                            if let Some(s) = need(r as usize, op.need_by[m], &ranks) {
                                ranks[r as usize].pending[s] -= 1;
                                dirty.push(r);
                            }
                        }
                    }
                    Ev::FlowActive(i) => {
                        if flows[i].remaining <= 0.0 {
                            finish_flow(i, now, p, &mut flows, &mut ranks, &mut dirty);
                        } else {
                            drain(&active, &mut flows, now, &mut last_rate_update);
                            flows[i].state = FlowState::Active;
                            active.push(i);
                            touched.extend(flow_ports[i]);
                            active_changed = true;
                        }
                    }
                    Ev::FlowsDone(e) => {
                        if e == epoch {
                            drain(&active, &mut flows, now, &mut last_rate_update);
                            // Every flow whose bytes are drained by now (ETAs are rounded up
                            // to whole nanoseconds, so the earliest one is at or below zero).
                            let (done, still): (Vec<usize>, Vec<usize>) =
                                active.iter().partition(|&&i| {
                                    flows[i].remaining <= flows[i].rate * COMPLETION_SLACK_NS
                                });
                            active = still;
                            for &i in &done {
                                touched.extend(flow_ports[i]);
                            }
                            for i in done {
                                flows[i].remaining = 0.0;
                                finish_flow(i, now, p, &mut flows, &mut ranks, &mut dirty);
                            }
                            active_changed = true;
                        }
                    }
                }
                continue;
            }
        }
        if !dirty.is_empty() {
            continue;
        }
        if active_changed {
            active_changed = false;
            drain(&active, &mut flows, now, &mut last_rate_update);
            // The active flows connected to a touched port, in `active` order (so that the
            // water-filling sees them as it would among all active flows: same rates, bit
            // for bit).
            touched.close_over(active.iter().map(|&i| flow_ports[i]));
            component.clear();
            component.extend(
                active
                    .iter()
                    .copied()
                    .filter(|&i| touched.contains(flow_ports[i][0])),
            );
            touched.clear();
            ports.clear();
            ports.extend(component.iter().map(|&i| flow_ports[i]));
            let rates = fair.rates(net, &ports);
            for (k, &i) in component.iter().enumerate() {
                flows[i].rate = rates[k];
            }
            epoch += 1;
            let mut next: Option<u64> = None;
            for &i in &active {
                let f = &flows[i];
                if f.rate > 0.0 {
                    let eta = ceil_ns(f.remaining / f.rate);
                    next = Some(next.map_or(eta, |n: u64| n.min(eta)));
                }
            }
            done_at = next.map(|eta| now + eta);
        }
        match (heap.peek().map(|&Reverse((t, _))| t), done_at) {
            (Some(t), Some(d)) => now = t.min(d),
            (Some(t), None) | (None, Some(t)) => now = t,
            (None, None) => break,
        }
    }
    if let Some((r, rr)) = ranks.iter().enumerate().find(|(_, rr)| !rr.done) {
        let at = if rr.next < rr.nsteps {
            format!("before step {}", rr.next)
        } else {
            "past its last step".to_string()
        };
        return Err(SimError::Deadlock(format!(
            "rank {r} waits forever {at} ({} inputs never arrive)",
            rr.pending.get(rr.next as usize).copied().unwrap_or(0)
        )));
    }
    // Per-rank communication time (union of busy intervals), bytes and finish time.
    let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
    for (i, f) in p.flows.iter().enumerate() {
        let rt = &flows[i];
        out[f.src as usize].bytes_sent += f.bytes;
        out[f.dst as usize].bytes_recv += f.bytes;
        let landed = &mut out[f.dst as usize].inputs_done_ns;
        *landed = (*landed).max(rt.done);
        timeline[f.src as usize].send.push((rt.issued, rt.done));
        timeline[f.dst as usize].recv.push((rt.issued, rt.done));
        for r in [f.src, f.dst] {
            spans[r as usize].push((rt.issued, rt.done));
        }
    }
    for (c, op) in p.collectives.iter().enumerate() {
        for (m, &r) in op.members.iter().enumerate() {
            out[r as usize].bytes_sent += op.sent[m];
            out[r as usize].bytes_recv += op.recv[m];
            let landed = &mut out[r as usize].inputs_done_ns;
            *landed = (*landed).max(coll_span[c].1);
            spans[r as usize].push(coll_span[c]);
            timeline[r as usize].send.push(coll_span[c]);
            timeline[r as usize].recv.push(coll_span[c]);
        }
    }
    let mut end = 0;
    for (r, o) in out.iter_mut().enumerate() {
        // Before the union, which drops empty spans (a message may land at its issue time).
        let comm_end = spans[r].iter().map(|s| s.1).max().unwrap_or(0);
        let moving = waits::union(std::mem::take(&mut spans[r]));
        o.comm_ns = waits::total(&moving);
        o.compute_end_ns = ranks[r].compute_end;
        o.finish_ns = ranks[r].compute_end.max(comm_end);
        o.exposed_ns += o.finish_ns - ranks[r].compute_end;
        let (_, on_peers) = waits::split(&timeline[r].compute, &moving, o.finish_ns);
        o.waiting_on_peers_ns = waits::total(&on_peers);
        end = end.max(o.finish_ns);
    }
    Ok(PassOutcome {
        ranks: out,
        end_ns: end,
        timeline,
    })
}

fn issue_flow(
    i: usize,
    now: u64,
    p: &Program,
    net: &Network,
    flows: &mut [FlowRt],
    heap: &mut BinaryHeap<Reverse<(u64, Ev)>>,
) {
    let f = &p.flows[i];
    flows[i].state = FlowState::Latency;
    flows[i].issued = now;
    heap.push(Reverse((
        now + net.alpha_ns(f.src, f.dst),
        Ev::FlowActive(i),
    )));
}

fn finish_flow(
    i: usize,
    now: u64,
    p: &Program,
    flows: &mut [FlowRt],
    ranks: &mut [RankRt],
    dirty: &mut Vec<u32>,
) {
    flows[i].state = FlowState::Done;
    flows[i].done = now;
    let f = &p.flows[i];
    if let Some(s) = f.need_by {
        let rr = &mut ranks[f.dst as usize];
        rr.pending[s.min(rr.nsteps) as usize] -= 1;
        dirty.push(f.dst);
    }
}

/// `x.ceil().max(0.0) as u64`, without the libm call `ceil` is on x86-64's baseline (a tenth of
/// the engine's own time at 1024 ranks, where every rate change re-times every flow in flight).
fn ceil_ns(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let t = x as u64;
    if (t as f64) < x {
        t.saturating_add(1)
    } else {
        t
    }
}

/// Bring every active flow's remaining bytes up to `now` at its current rate.
fn drain(active: &[usize], flows: &mut [FlowRt], now: u64, last: &mut u64) {
    let dt = (now - *last) as f64;
    if dt > 0.0 {
        for &i in active {
            let f = &mut flows[i];
            f.remaining = (f.remaining - f.rate * dt).max(0.0);
        }
    }
    *last = now;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Pass;
    use crate::sim::program::{Flow, StepCost};

    proptest::proptest! {
        /// The same whole nanoseconds as `ceil`, over every magnitude and the edges.
        #[test]
        fn ceil_ns_is_ceil(bits in proptest::prelude::any::<u64>(), small in -1e3f64..1e12) {
            for x in [f64::from_bits(bits), small, small.trunc(), -0.0, 0.0, 2f64.powi(53) + 2.0, 2f64.powi(64), 1e300] {
                proptest::prop_assert_eq!(ceil_ns(x), x.ceil().max(0.0) as u64, "{}", x);
            }
        }
    }

    /// 2 GPUs per node; NVLink 100 B/ns, α 1 µs; NIC 10 B/ns, α 5 µs.
    fn net() -> Network {
        Network::custom(2, 100.0, 10.0, 1000, 5000)
    }

    fn steps(ns: &[&[u64]]) -> Vec<Vec<StepCost>> {
        ns.iter()
            .map(|r| r.iter().map(|&ns| StepCost { ns, flops: 0.0 }).collect())
            .collect()
    }

    fn flow(src: u32, dst: u32, bytes: u64, issue_at: u32, need_by: Option<u32>) -> Flow {
        Flow {
            src,
            dst,
            bytes,
            issue_at,
            need_by,
            forwards: false,
        }
    }

    fn run_program(steps: Vec<Vec<StepCost>>, flows: Vec<Flow>) -> PassOutcome {
        let p = Program {
            pass: Pass::Fwd,
            steps,
            flows,
            collectives: vec![],
        };
        let n = net();
        run(&p, &[], &n, &CollectiveModel::new(&n, None)).unwrap()
    }

    #[test]
    fn one_rank_is_its_kernel_time() {
        let o = run_program(steps(&[&[700, 300]]), vec![]);
        assert_eq!(o.end_ns, 1000);
        assert_eq!(o.ranks[0].compute_ns, 1000);
        assert_eq!(o.ranks[0].exposed_ns, 0);
    }

    #[test]
    fn one_transfer_costs_alpha_plus_bytes_over_bandwidth() {
        // Rank 1's step 1 needs 10 000 bytes from rank 0 over NVLink: 1000 + 10000/100 ns.
        let o = run_program(
            steps(&[&[0], &[0, 50]]),
            vec![flow(0, 1, 10_000, 0, Some(1))],
        );
        assert_eq!(o.end_ns, 1000 + 100 + 50);
        assert_eq!(o.ranks[1].exposed_ns, 1100);
        assert_eq!(o.ranks[1].comm_ns, 1100);
        // Across nodes: NIC α and bandwidth.
        let o = run_program(
            steps(&[&[0], &[0], &[0, 50]]),
            vec![flow(0, 2, 10_000, 0, Some(1))],
        );
        assert_eq!(o.end_ns, 5000 + 1000 + 50);
    }

    #[test]
    fn two_flows_through_one_nic_take_twice_as_long() {
        let one = run_program(
            steps(&[&[0], &[0], &[0, 0]]),
            vec![flow(0, 2, 100_000, 0, Some(1))],
        );
        let two = run_program(
            steps(&[&[0], &[0], &[0, 0]]),
            vec![
                flow(0, 2, 100_000, 0, Some(1)),
                flow(1, 2, 100_000, 0, Some(1)),
            ],
        );
        // Both pay α = 5000 in parallel, then share rank 2's NIC.
        assert_eq!(one.end_ns, 5000 + 10_000);
        assert_eq!(two.end_ns, 5000 + 20_000);
    }

    #[test]
    fn transfer_hidden_behind_compute_adds_nothing() {
        // Rank 1 computes 5000 ns in step 0 while the 1100 ns transfer for step 1 flies.
        let o = run_program(
            steps(&[&[0], &[5000, 50]]),
            vec![flow(0, 1, 10_000, 0, Some(1))],
        );
        assert_eq!(o.end_ns, 5050);
        assert_eq!(o.ranks[1].exposed_ns, 0);
    }

    #[test]
    fn forwarded_data_leaves_only_after_it_arrived() {
        // 0 → 1 (needed by 1's step 1), then 1 forwards it to 2 at its step 1.
        let mut fwd = flow(1, 2, 10_000, 1, Some(1));
        fwd.forwards = true;
        let o = run_program(
            steps(&[&[0], &[0, 0], &[0, 0]]),
            vec![flow(0, 1, 10_000, 0, Some(1)), fwd],
        );
        // 1100 to reach rank 1 over NVLink, then 5000 + 1000 over the NIC to rank 2.
        assert_eq!(o.end_ns, 1100 + 6000);
    }

    #[test]
    fn a_late_start_delays_the_rank_and_what_it_sends() {
        // Rank 0 is busy until 3000 ns (work before attention), so its K/V leaves then; rank 1
        // starts at once but waits for it. Rank 2 starts late and has no step at all.
        let p = Program {
            pass: Pass::Fwd,
            steps: steps(&[&[1000], &[50], &[]]),
            flows: vec![flow(0, 1, 10_000, 0, Some(0))],
            collectives: vec![],
        };
        let n = net();
        let o = run(&p, &[3000, 0, 7000], &n, &CollectiveModel::new(&n, None)).unwrap();
        // 3000 + α 1000 + 10,000 B at 100 B/ns over NVLink.
        assert_eq!(o.ranks[1].inputs_done_ns, 4100);
        assert_eq!(o.ranks[1].compute_end_ns, 4150);
        assert_eq!(
            o.ranks[1].exposed_ns, 4100,
            "waited from 0 for rank 0's K/V"
        );
        assert_eq!(o.ranks[0].compute_end_ns, 4000);
        // Its late start is not waiting for data; only its own message's tail after its step.
        assert_eq!(o.ranks[0].exposed_ns, 100);
        assert_eq!(o.ranks[0].inputs_done_ns, 0);
        assert_eq!(
            (o.ranks[2].compute_end_ns, o.ranks[2].finish_ns),
            (7000, 7000)
        );
        assert_eq!(o.end_ns, 7000);
        // Without starts the same program is the plain pass.
        let plain = run(&p, &[], &n, &CollectiveModel::new(&n, None)).unwrap();
        assert_eq!(plain.ranks[1].compute_end_ns, 1150);
    }

    /// Two ranks forwarding to each other at `step` what the other's message brings.
    fn forwarding_circle(step: u32) -> Result<PassOutcome, SimError> {
        let mut a = flow(0, 1, 10, step, Some(step));
        a.forwards = true;
        let mut b = flow(1, 0, 10, step, Some(step));
        b.forwards = true;
        let p = Program {
            pass: Pass::Fwd,
            steps: steps(&[&[1], &[1]]),
            flows: vec![a, b],
            collectives: vec![],
        };
        let n = net();
        run(&p, &[], &n, &CollectiveModel::new(&n, None))
    }

    #[test]
    fn impossible_dependencies_are_reported_not_hung() {
        let err = forwarding_circle(0).unwrap_err();
        assert!(err.to_string().contains("deadlock"), "{err}");
    }

    #[test]
    fn regression_forwards_past_the_last_step_wait_for_what_they_forward() {
        // Rank 2 sends rank 1 data due past its last step; rank 1 forwards it to 0 at its end.
        // The forward leaves once the data is in (rank 2 is on the other node: α 5000 + 1000
        // over its NIC), not when rank 1's compute ends; then 1100 over NVLink to rank 0.
        let mut fwd = flow(1, 0, 10_000, 1, None);
        fwd.forwards = true;
        let o = run_program(
            steps(&[&[0], &[10], &[0]]),
            vec![flow(2, 1, 10_000, 0, Some(1)), fwd],
        );
        assert_eq!(o.ranks[1].inputs_done_ns, 6000);
        assert_eq!(o.ranks[1].compute_end_ns, 10, "its compute ended before");
        assert_eq!(o.end_ns, 6000 + 1100);
        // Two such forwards waiting on each other never leave (bug hunt: both left at once,
        // so the circle passed, and the replay hung on it).
        let err = forwarding_circle(1).unwrap_err();
        assert!(err.to_string().contains("past its last step"), "{err}");
    }
}

/// A set of port ids with the closure [`PortSet::close_over`] needs: the ports of the flows that
/// changed, grown to every port their connected component of active flows reaches.
struct PortSet {
    member: Vec<bool>,
    list: Vec<usize>,
    /// Scratch of [`PortSet::close_over`] (union-find parents, touched roots), kept between
    /// calls: the engine closes the set at every rate recompute.
    parent: Vec<usize>,
    hit: Vec<bool>,
}

impl PortSet {
    fn new(ports: usize) -> Self {
        PortSet {
            member: vec![false; ports],
            list: Vec::new(),
            parent: Vec::with_capacity(ports),
            hit: vec![false; ports],
        }
    }

    fn contains(&self, p: usize) -> bool {
        self.member[p]
    }

    fn insert(&mut self, p: usize) {
        if !self.member[p] {
            self.member[p] = true;
            self.list.push(p);
        }
    }

    fn extend(&mut self, ps: [usize; 2]) {
        self.insert(ps[0]);
        self.insert(ps[1]);
    }

    /// Grow the set until no flow of `flows` (its two ports) has one port in and one out:
    /// a union-find over the ports, then every port in a touched port's class joins.
    fn close_over(&mut self, flows: impl Iterator<Item = [usize; 2]> + Clone) {
        if self.list.is_empty() {
            return;
        }
        let mut parent = std::mem::take(&mut self.parent);
        parent.clear();
        parent.extend(0..self.member.len());
        let mut hit = std::mem::take(&mut self.hit);
        hit.fill(false);
        fn root(parent: &mut [usize], mut x: usize) -> usize {
            while parent[x] != x {
                parent[x] = parent[parent[x]];
                x = parent[x];
            }
            x
        }
        for [a, b] in flows.clone() {
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            if ra != rb {
                parent[ra.max(rb)] = ra.min(rb);
            }
        }
        for &p in &self.list {
            let r = root(&mut parent, p);
            hit[r] = true;
        }
        for [a, b] in flows {
            if hit[root(&mut parent, a)] {
                self.insert(a);
                self.insert(b);
            }
        }
        self.parent = parent;
        self.hit = hit;
    }

    fn clear(&mut self) {
        for &p in &self.list {
            self.member[p] = false;
        }
        self.list.clear();
    }
}

#[cfg(test)]
mod port_set_tests {
    use super::*;
    use crate::sim::network::{max_min_rates, Network};

    /// Flows among 12 GPUs (2 per node) from a fixed pseudo-random sequence.
    fn flows(net: &Network, count: usize, seed: u64) -> Vec<[usize; 2]> {
        let mut x = seed;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32 % 12
        };
        (0..count)
            .map(|_| loop {
                let (a, b) = (next(), next());
                if a != b {
                    return net.ports(a, b);
                }
            })
            .collect()
    }

    #[test]
    fn a_component_s_rates_alone_are_its_rates_among_all_flows_bit_for_bit() {
        // What lets the engine recompute only the flows connected to a change: max-min
        // fairness splits over connected components, and the water-filling run on one
        // component (flows in the same order) performs the same operations.
        let net = Network::custom(2, 100.0, 10.0, 1000, 5000);
        for seed in 0..50 {
            let all = flows(&net, 1 + seed as usize % 9, seed);
            let global = max_min_rates(&net, &all);
            let mut set = PortSet::new(4 * 12);
            set.extend(all[0]);
            set.close_over(all.iter().copied());
            let (mine, rest): (Vec<usize>, Vec<usize>) =
                (0..all.len()).partition(|&i| set.contains(all[i][0]));
            assert!(mine.contains(&0));
            // Closed: no flow has one port in the set and one out.
            for f in &all {
                assert_eq!(set.contains(f[0]), set.contains(f[1]));
            }
            let sub: Vec<[usize; 2]> = mine.iter().map(|&i| all[i]).collect();
            let alone = max_min_rates(&net, &sub);
            for (k, &i) in mine.iter().enumerate() {
                assert_eq!(alone[k].to_bits(), global[i].to_bits(), "seed {seed}");
            }
            let others: Vec<[usize; 2]> = rest.iter().map(|&i| all[i]).collect();
            let theirs = max_min_rates(&net, &others);
            for (k, &i) in rest.iter().enumerate() {
                assert_eq!(theirs[k].to_bits(), global[i].to_bits(), "seed {seed}");
            }
            set.clear();
            assert!((0..48).all(|p| !set.contains(p)));
        }
    }
}
