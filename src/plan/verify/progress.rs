//! Progress: the plan can run to its end. Every step waits for its inputs, a message leaves
//! when its sender reaches its issue step (one that forwards received data, once the sender has
//! that step's inputs: [`crate::plan::forwarding`]), and a collective call runs only once every
//! member has joined it, at the earliest issue step of a piece it sends or receives. Each check
//! of availability holds transfer by transfer, yet the waits can close a cycle: a piece moved
//! into a collective whose other members join later than its receiver needs it stalls the
//! receiver, and a member that waits on the receiver never joins (bug hunt: `fcp verify` passed
//! such a plan, and `fcp simulate` then refused it as deadlocked).
//!
//! The backward pass, which the simulator derives from the plan, repeats the forward pass's
//! Q and K/V deliveries and adds gradients that no step waits for and output gradients
//! sent at step 0; it runs to its end when the forward pass does, given that no call mixes
//! outputs with Q or K/V (checked here too).
//!
//! The check runs the plan in logical time, as the simulator's engine does without durations:
//! a rank advances past a step once each of that step's inputs can have been sent, until
//! nothing moves. Every rank must get past its last step, and past its end: a pseudo-step
//! after the last, which waits for everything still due to the rank (the replay waits for
//! every message before it ends), and at which forwards issued at or past the last step leave.

use std::collections::BTreeMap;

use super::{v, Violation, ViolationKind};
use crate::hashing::FastMap;
use crate::plan::{Plan, TransferKind, TransferTensor};

/// What a step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Need {
    /// Rank `src` has got past this many steps (a message it sends then).
    Rank { src: u32, past: u32 },
    /// Collective call number `c` has run.
    Call(usize),
}

/// A collective call: (member, the step at whose start it joins).
type Call = Vec<(u32, u32)>;

/// A call's receiving members as its pieces are read: per rank, the earliest step that waits
/// for the call.
type Waiting = FastMap<u32, u32>;

pub(super) fn check_progress(plan: &Plan, out: &mut Vec<Violation>) {
    let steps: Vec<u32> = plan.ranks.iter().map(|r| r.steps.len() as u32).collect();
    let n = steps.len();
    // The step of `r` that waits for what is due by step `s`: past the last step, the end (a
    // pseudo-step at index `steps[r]`, which a rank gets past once everything due to it has
    // arrived, as the replay's last wait; bug hunt: a circle of forwards issued at the end
    // passed, since nothing waited for them, and hung the replay).
    let waits = |r: u32, s: u32| s.min(steps[r as usize]);
    let forwards = crate::plan::forwarding(plan);
    let mut needs: Vec<BTreeMap<u32, Vec<Need>>> = vec![BTreeMap::new(); n];
    // Per call (id, kind), per receiving member, the earliest step that waits for it; the
    // members' join steps are `call_joins`'.
    let mut waiting: BTreeMap<(u32, TransferKind), Waiting> = BTreeMap::new();
    // Per collective id (any kind): whether it carries Q or K/V out, and outputs back.
    let mut ways: BTreeMap<u32, [bool; 2]> = BTreeMap::new();
    for (i, t) in plan.transfers.iter().enumerate() {
        let need_by = (t.tensor != TransferTensor::Out).then_some(t.arrive_by);
        match t.call() {
            None => {
                let last = steps[t.src as usize];
                let issue = t.issue_at.min(last);
                // A forward leaves once its sender can start the step, so once past it (at
                // the end, once the sender has everything due to it).
                let past = if forwards[i] { issue + 1 } else { issue };
                for dst in t.receivers() {
                    if let Some(s) = need_by.map(|a| waits(dst, a)) {
                        needs[dst as usize]
                            .entry(s)
                            .or_default()
                            .push(Need::Rank { src: t.src, past });
                    }
                }
            }
            Some((id, kind)) => {
                // A member waits from the earliest piece it receives (the simulator's
                // reading, `sim::program`).
                ways.entry(id).or_default()[usize::from(t.tensor == TransferTensor::Out)] = true;
                if let Some(a) = need_by {
                    let call = waiting.entry((id, kind)).or_default();
                    for dst in t.receivers() {
                        let d = call.entry(dst).or_insert(a);
                        *d = (*d).min(a);
                    }
                }
            }
        }
    }
    // One collective id moves one way. The backward pass returns Q and K/V gradients and
    // sends the outputs' gradients in calls whose ids derive from the plan's: an id carrying
    // both would merge the two there, and could deadlock the backward pass alone.
    for (id, _) in ways.iter().filter(|(_, w)| w[0] && w[1]) {
        out.push(v(
            ViolationKind::BadTransfer,
            format!("collective {id} carries both `out` pieces and `q`/`kv` pieces: one collective moves one way; give the outputs' returns a collective id of their own"),
        ));
    }
    let calls = super::call_joins(plan);
    let mut members: Vec<Call> = Vec::with_capacity(calls.len());
    let mut names: Vec<u32> = Vec::with_capacity(calls.len());
    for (key, joins) in calls {
        let c = members.len();
        let waits_from = waiting.get(&key);
        let call: Vec<(u32, (u32, Option<u32>))> = joins
            .into_iter()
            .map(|(r, join)| (r, (join, waits_from.and_then(|w| w.get(&r).copied()))))
            .collect();
        for &(r, (_, need)) in &call {
            if let Some(s) = need.map(|a| waits(r, a)) {
                needs[r as usize].entry(s).or_default().push(Need::Call(c));
            }
        }
        members.push(
            call.into_iter()
                .map(|(r, (join, _))| (r, join.min(steps[r as usize])))
                .collect(),
        );
        names.push(key.0);
    }
    for m in &mut needs {
        for list in m.values_mut() {
            list.sort_unstable();
            list.dedup();
        }
    }
    // Who to look at again when a rank moves: the ranks waiting on its sends, and through
    // the calls it joins, the ranks waiting on those calls.
    let mut waiters: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut call_waiters: Vec<Vec<u32>> = vec![Vec::new(); members.len()];
    for (r, m) in needs.iter().enumerate() {
        for need in m.values().flatten() {
            match *need {
                Need::Rank { src, .. } => waiters[src as usize].push(r as u32),
                Need::Call(c) => call_waiters[c].push(r as u32),
            }
        }
    }
    for w in waiters.iter_mut().chain(call_waiters.iter_mut()) {
        w.sort_unstable();
        w.dedup();
    }
    // Per rank, the calls it joins and at which step; per call, the members yet to join.
    let mut joins: Vec<Vec<(usize, u32)>> = vec![Vec::new(); n];
    let mut missing: Vec<usize> = vec![0; members.len()];
    for (c, call) in members.iter().enumerate() {
        for &(m, j) in call {
            joins[m as usize].push((c, j));
            missing[c] += 1;
        }
    }
    // Logical time: `past[r]` steps of rank r can run. Monotone; a worklist looks at a rank
    // again only when something it waits on moved (bug hunt: sweeping every rank until
    // still was quadratic on a chain of forwards, 18 s at 65,536 ranks).
    let mut past = vec![0u32; n];
    let mut ran = vec![false; members.len()];
    let mut queue: Vec<u32> = (0..n as u32).rev().collect();
    let mut queued = vec![true; n];
    let wake = |rs: &[u32], queue: &mut Vec<u32>, queued: &mut [bool]| {
        for &w in rs {
            if !queued[w as usize] {
                queued[w as usize] = true;
                queue.push(w);
            }
        }
    };
    // A member joins a call when it gets past the steps before its join step.
    let mut joined =
        |r: usize, at: u32, ran: &mut [bool], queue: &mut Vec<u32>, queued: &mut [bool]| {
            for &(c, j) in &joins[r] {
                if j == at {
                    missing[c] -= 1;
                    if missing[c] == 0 {
                        ran[c] = true;
                        wake(&call_waiters[c], queue, queued);
                    }
                }
            }
        };
    for r in 0..n {
        joined(r, 0, &mut ran, &mut queue, &mut queued);
    }
    while let Some(r) = queue.pop() {
        let r = r as usize;
        queued[r] = false;
        let before = past[r];
        while past[r] <= steps[r] {
            let ok = needs[r].get(&past[r]).is_none_or(|list| {
                list.iter().all(|x| match *x {
                    Need::Rank { src, past: p } => past[src as usize] >= p,
                    Need::Call(c) => ran[c],
                })
            });
            if !ok {
                break;
            }
            past[r] += 1;
            joined(r, past[r], &mut ran, &mut queue, &mut queued);
        }
        if past[r] > before {
            wake(&waiters[r], &mut queue, &mut queued);
        }
    }
    let met = |need: &Need| match *need {
        Need::Rank { src, past: p } => past[src as usize] >= p,
        Need::Call(c) => ran[c],
    };
    for r in (0..n).filter(|&r| past[r] <= steps[r]) {
        let s = past[r];
        let why = needs[r]
            .get(&s)
            .and_then(|list| list.iter().find(|x| !met(x)))
            .map_or(String::new(), |x| match *x {
                Need::Rank { src, .. } => {
                    let at = past[src as usize];
                    let where_ = if at < steps[src as usize] {
                        format!("its step {at}")
                    } else {
                        "its end".to_string()
                    };
                    format!(
                        ": it waits for a transfer from rank {src}, which never gets past {where_}"
                    )
                }
                Need::Call(c) => {
                    let late: Vec<String> = members[c]
                        .iter()
                        .filter(|&&(m, j)| past[m as usize] < j)
                        .take(4)
                        .map(|&(m, j)| {
                            format!(
                                "rank {m} (joins at step {j}, stuck before step {})",
                                past[m as usize]
                            )
                        })
                        .collect();
                    format!(
                        ": it waits for collective {} to run, which waits for {}",
                        names[c],
                        late.join(", ")
                    )
                }
            });
        let stuck = if s < steps[r] {
            format!("never starts step {s}")
        } else {
            "never gets past its end".to_string()
        };
        out.push(v(ViolationKind::Deadlock, format!("rank {r} {stuck}{why}")));
    }
}
