//! The verifier rejects each kind of broken plan.

use std::collections::BTreeSet;

use super::ViolationKind as K;
use super::*;
use crate::plan::TransferTensor;
use crate::plan::{Mask, Step, Transfer};
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

/// Regression (user report): `fcp verify` passed a plan whose `scheme.params.grad_bytes` was
/// hand-edited to 0, -4 or "x" (the simulator then used the model's dtype, or free gradient
/// traffic), and one whose ranks padded 2⁶³ slots each, which overflowed `pad_tokens`.
#[test]
fn hand_edited_grad_bytes_and_pad_slots_are_violations() {
    for bad in [
        serde_json::json!(0),
        serde_json::json!(-4),
        serde_json::json!("x"),
        serde_json::json!(1.5),
        serde_json::json!(9),
        serde_json::Value::Null,
    ] {
        let mut p = plan();
        p.scheme.params.insert("grad_bytes".into(), bad.clone());
        let vs = verify(&p);
        assert_eq!(vs.len(), 1, "{bad}: {vs:?}");
        assert_eq!(vs[0].kind, K::Header);
        assert!(
            vs[0]
                .message
                .contains(&format!("scheme.params.grad_bytes is {bad}")),
            "{}",
            vs[0]
        );
    }
    for good in [1, 2, 4, 8] {
        let mut p = plan();
        p.scheme.params.insert("grad_bytes".into(), good.into());
        assert_eq!(verify(&p), vec![], "grad_bytes {good}");
    }
    let mut p = plan();
    p.ranks[1].pad_slots = 1 << 63;
    p.ranks[2].pad_slots = 1 << 63;
    p.ranks[3].pad_slots = MAX_PAD_SLOTS;
    let vs = verify(&p);
    assert_eq!(vs.len(), 2, "{vs:?}");
    assert!(
        vs[0].message.contains(
            "rank entry 1 has pad_slots 9223372036854775808, more than the 4294967296 (2^32)"
        ),
        "{}",
        vs[0]
    );
    assert_eq!(p.pad_tokens(), u64::MAX, "saturates, never wraps or panics");
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

/// Regression (bug hunt): a congestion-free plan's transfer with an `also_to` receiver counted
/// as one send (listed once per receiver it was refused), and a `p2p` transfer carrying a
/// `collective` id, which the simulator runs as a point-to-point message, escaped the check.
#[test]
fn regression_congestion_counts_every_delivery_and_stray_collective_ids() {
    let mut p = plan();
    p.congestion_free = true;
    let first = p
        .transfers
        .iter()
        .position(|t| t.src == 0 && t.round() == 0)
        .unwrap();
    let spare = (0..4)
        .find(|&r| {
            r != 0
                && p.transfers
                    .iter()
                    .all(|t| t.round() != 0 || !t.receivers().any(|d| d == r))
        })
        .unwrap_or(2);
    p.transfers[first].also_to = vec![spare];
    p.version = 2;
    let vs = verify(&p);
    assert!(
        vs.iter()
            .any(|v| v.kind == K::Congestion && v.message.contains("rank 0 sends 2 transfers")),
        "{vs:?}"
    );
    let mut p = plan();
    p.congestion_free = true;
    for t in &mut p.transfers {
        t.collective = Some(5);
    }
    let extra = Transfer {
        collective: Some(5),
        ..Transfer::kv(0, 2, vec![p.ranks[0].owned[0]], 0, 1)
    };
    p.transfers.push(extra);
    assert!(kinds(&p).contains(&K::Congestion));
}

/// Regression (bug hunt): a `kv` transfer listing every head (`heads: [0, q_heads)`) did not
/// serve a task without heads, and two transfers of half the heads each did not serve a task
/// of all of them; the executor ran both plans correctly.
#[test]
fn regression_heads_held_whole_or_in_parts_serve_every_reader() {
    let mut p = plan();
    let all = HeadRange::from((0, p.q_heads));
    let group = p.q_heads / p.kv_heads;
    assert!(p.kv_heads >= 2, "two halves of whole GQA groups");
    let half = p.kv_heads / 2 * group;
    let kv = p
        .transfers
        .iter()
        .position(|t| t.tensor == TransferTensor::Kv)
        .unwrap();
    p.transfers[kv].heads = Some(all);
    assert_eq!(verify(&p), vec![]);
    let mut lower = p.transfers[kv].clone();
    lower.heads = Some(HeadRange::from((0, half)));
    p.transfers[kv].heads = Some(HeadRange::from((half, p.q_heads)));
    p.transfers.push(lower.clone());
    assert_eq!(verify(&p), vec![]);
    // Half the heads alone still do not serve a reader of all.
    p.transfers.pop();
    assert!(kinds(&p).contains(&K::NotAvailable));
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

/// Regression (bug hunt): a zigzag plan edited so that rank 0 had 7 steps and the others 5
/// verified, though the format gives every rank the same number of steps.
#[test]
fn ranks_with_different_step_counts_are_a_violation() {
    let mut p = plan();
    let n = p.ranks[0].steps.len();
    p.ranks[0].steps.extend([Step::default(), Step::default()]);
    let vs = verify(&p);
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(vs[0].kind, K::StepCount);
    assert!(
        vs[0].message.starts_with(&format!(
            "rank 1 has {n} steps, rank 0 has {} (2 more ranks differ from rank 0)",
            n + 2
        )),
        "{}",
        vs[0]
    );
    // One rank alone differing is named alone.
    let mut p = plan();
    p.ranks[2].steps.push(Step::default());
    let vs = verify(&p);
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert!(
        vs[0]
            .message
            .starts_with(&format!("rank 2 has {} steps, rank 0 has {n}:", n + 1)),
        "{}",
        vs[0]
    );
    // Padded alike, every rank: still valid (trailing empty steps are padding).
    let mut p = plan();
    for r in &mut p.ranks {
        r.steps.push(Step::default());
    }
    assert_eq!(verify(&p), vec![]);
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

#[test]
fn padding_extends_the_document_and_nothing_beyond() {
    let mut p = plan();
    // Doc 3 has one token; pretend the scheme padded it by 3 and owns them on rank 0.
    p.documents[3].pad = 3;
    assert!(kinds(&p).contains(&K::NotOwned), "padding must be owned");
    p.ranks[0].owned.push(TokenRange::new(3, 1, 4));
    assert!(
        kinds(&p).contains(&K::MissingPairs),
        "padding must be computed"
    );
    p.ranks[0].steps[0].tasks.push(crate::plan::Task {
        q: TokenRange::new(3, 1, 4),
        kv: TokenRange::new(3, 0, 4),
        heads: None,
    });
    assert_eq!(verify(&p), vec![]);
    p.ranks[0].owned.push(TokenRange::new(3, 4, 5));
    assert!(kinds(&p).contains(&K::BadRange), "nothing beyond len + pad");
}

/// An FCP plan with the reshuffler: it starts from the user's contiguous layout.
fn reshuffled() -> Plan {
    let batch = Batch::new(0, vec![300, 64, 900, 7, 500]);
    let plan = with_ctx(4, Mask::Causal, |ctx| {
        let f = crate::planners::Fcp::from_spec(
            &crate::planners::SchemeSpec::parse("fcp:block=128,coalesce=2,reshuffle=true").unwrap(),
        )
        .unwrap();
        f.plan(&batch, ctx)
    })
    .unwrap();
    assert!(plan.input_layout.is_some());
    assert_eq!(verify(&plan), vec![]);
    plan
}

fn is_reshuffle(t: &Transfer, tensor: TransferTensor) -> bool {
    t.collective.is_some() && t.tensor == tensor
}

#[test]
fn reshuffled_plan_round_trips_and_old_plans_omit_the_field() {
    let p = reshuffled();
    let back = Plan::from_json(&p.to_json(), "t").unwrap();
    assert_eq!(back, p);
    assert!(p.to_json().contains("\"input_layout\""));
    assert!(!plan().to_json().contains("input_layout"));
}

#[test]
fn rejects_a_missing_inbound_reshuffle_piece() {
    for tensor in [TransferTensor::Q, TransferTensor::Kv] {
        let mut p = reshuffled();
        let i = p
            .transfers
            .iter()
            .position(|t| is_reshuffle(t, tensor))
            .unwrap();
        p.transfers.remove(i);
        let k = kinds(&p);
        assert!(k.contains(&K::NotAvailable), "{tensor:?}: {k:?}");
    }
}

#[test]
fn rejects_a_missing_or_early_output_return() {
    let mut p = reshuffled();
    let i = p
        .transfers
        .iter()
        .position(|t| is_reshuffle(t, TransferTensor::Out))
        .unwrap();
    let t = p.transfers.remove(i);
    assert!(kinds(&p).contains(&K::OutputNotReturned));
    // Returned before the rows are final on the planned owner.
    let mut p = reshuffled();
    p.transfers[i].issue_at = 1;
    let k = kinds(&p);
    assert!(
        k.contains(&K::OutputNotReturned) || k.contains(&K::BadTransfer),
        "{k:?} {t:?}"
    );
}

#[test]
fn rejects_a_bad_input_layout() {
    let mut p = reshuffled();
    let layout = p.input_layout.as_mut().unwrap();
    let r = layout[1].pop().unwrap();
    assert!(kinds(&p).contains(&K::NotOwned));
    let mut p = reshuffled();
    p.input_layout.as_mut().unwrap()[0].push(r);
    assert!(kinds(&p).contains(&K::OwnedTwice));
    let mut p = reshuffled();
    p.input_layout.as_mut().unwrap().pop();
    assert!(kinds(&p).contains(&K::Header));
}

#[test]
fn held_local_work_cannot_read_reshuffled_data_early() {
    // Moving a task that reads reshuffled data into step 0 reads it before it arrives.
    let mut p = reshuffled();
    let layout = p.input_layout.clone().unwrap();
    let held = |r: usize, c: &TokenRange| {
        layout[r]
            .iter()
            .any(|x| x.doc == c.doc && x.start <= c.start && c.end <= x.end)
    };
    let (r, s, j) = p
        .ranks
        .iter()
        .enumerate()
        .find_map(|(r, rp)| {
            rp.steps.iter().enumerate().skip(1).find_map(|(s, st)| {
                st.tasks
                    .iter()
                    .position(|t| !held(r, &t.q) || !held(r, &t.kv))
                    .map(|j| (r, s, j))
            })
        })
        .unwrap();
    let t = p.ranks[r].steps[s].tasks.remove(j);
    p.ranks[r].steps[0].tasks.push(t);
    assert!(kinds(&p).contains(&K::NotAvailable));
}

/// A multicast (`also_to`) needs format version 2, receivers that exist and differ from the
/// source and from each other, and a Q or K/V tensor; a valid one delivers to every receiver.
#[test]
fn also_to_receivers_are_checked() {
    let base = plan();
    let own = base.ranks[0].owned[0];
    let multicast = |also_to: Vec<u32>, tensor| {
        let mut p = base.clone();
        let mut t = Transfer::kv(0, 1, vec![own], 0, 1);
        t.also_to = also_to;
        t.tensor = tensor;
        p.transfers.push(t);
        p.version = 2;
        p
    };
    assert_eq!(verify(&multicast(vec![2, 3], TransferTensor::Kv)), vec![]);
    for (also_to, why) in [
        (vec![4], "does not exist"),
        (vec![0], "is the source"),
        (vec![1], "is dst already"),
        (vec![2, 2], "twice"),
    ] {
        let vs = verify(&multicast(also_to.clone(), TransferTensor::Kv));
        assert!(
            vs.iter()
                .any(|v| v.kind == K::Header && v.message.contains("also_to names rank")),
            "{also_to:?} ({why}): {vs:?}"
        );
    }
    let vs = verify(&multicast(vec![2], TransferTensor::Out));
    assert!(
        vs.iter()
            .any(|v| v.message.contains("an output return has one receiver")),
        "{vs:?}"
    );
    // A version-1 reader would drop the extra receivers: the plan must say version 2.
    let mut p = multicast(vec![2], TransferTensor::Kv);
    p.version = 1;
    let vs = verify(&p);
    assert!(
        vs.len() == 1 && vs[0].kind == K::Header && vs[0].message.contains("need version 2"),
        "{vs:?}"
    );
    p.version = 3;
    assert!(kinds(&p).contains(&K::Header));
}

/// What a multicast sends must be on its source at `issue_at`, as for a point-to-point one;
/// and each receiver may read it from `arrive_by`.
#[test]
fn a_multicast_delivers_to_every_receiver_and_sends_only_what_it_holds() {
    let mut p = plan();
    let foreign = p.ranks[3].owned[0];
    let mut t = Transfer::kv(0, 1, vec![foreign], 0, 1);
    t.also_to = vec![2];
    p.transfers.push(t);
    p.version = 2;
    assert!(kinds(&p).contains(&K::BadTransfer), "{:?}", verify(&p));
    // Rank 2 reads rank 1's first range at step 0, before the ring brings it; a multicast
    // whose first receiver is rank 3 serves it.
    let mut p = plan();
    let (q, kv) = (p.ranks[2].owned[0], p.ranks[1].owned[0]);
    p.ranks[2].steps[0]
        .tasks
        .push(crate::plan::Task { q, kv, heads: None });
    assert!(kinds(&p).contains(&K::NotAvailable));
    let mut t = Transfer::kv(1, 3, vec![kv], 0, 0);
    t.also_to = vec![2];
    p.transfers.push(t);
    p.version = 2;
    // Coverage may now complain (the task duplicates pairs), but the read itself is served.
    assert!(!kinds(&p).contains(&K::NotAvailable), "{:?}", verify(&p));
}

mod progress {
    use super::*;
    use crate::plan::TransferKind;
    use crate::planners::planner_for;
    use crate::sim::{PassSel, SimError, Simulator};
    use proptest::prelude::*;

    /// Regression (bug hunt): an FCP reshuffle plan with one `q` piece of its first all-to-all
    /// moved into the output all-to-all, which runs only after the last step, verified, and
    /// `fcp simulate` then found it deadlocked.
    #[test]
    fn a_piece_moved_into_a_later_collective_deadlocks() {
        let batch = Batch::new(0, vec![12, 3, 3]);
        let mut p = with_ctx(3, Mask::Causal, |ctx| {
            planner_for("fcp:reshuffle=true,block=2")
                .unwrap()
                .plan(&batch, ctx)
        })
        .unwrap();
        assert_eq!(verify(&p), vec![]);
        let early = p
            .transfers
            .iter()
            .position(|t| t.collective == Some(0) && t.tensor == TransferTensor::Q)
            .expect("a q piece of the reshuffle");
        p.transfers[early].collective = Some(1);
        assert!(kinds(&p).contains(&K::Deadlock), "{:?}", verify(&p));
    }

    /// Regression (bug hunt): a gradient's collective call took the id `id + 2³⁰`, so a plan
    /// collective numbered 2³⁰ merged with another call's gradients and changed the time.
    /// An id is only a name.
    #[test]
    fn a_collective_id_is_only_a_name() {
        let batch = Batch::new(0, vec![100, 37, 60, 20]);
        let base = with_ctx(4, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap();
        let sim = Simulator::new(
            crate::hardware::Hardware::load("h100").unwrap(),
            crate::Model::load("llama3-70b").unwrap(),
        )
        .unwrap();
        let timed = |x: u32| {
            let mut p = base.clone();
            p.transfers[1].kind = TransferKind::AllToAll;
            p.transfers[1].collective = Some(0);
            p.transfers[4].kind = TransferKind::AllToAll;
            p.transfers[4].collective = Some(x);
            assert_eq!(verify(&p), vec![], "{x}");
            sim.simulate(&p, PassSel::Both)
                .unwrap()
                .metrics
                .attention_time_ms
        };
        assert_eq!(timed(5), timed(1 << 30));
        assert_eq!(timed(5), timed(u32::MAX));
    }

    fn engine_deadlocks(p: &Plan) -> bool {
        let sim = Simulator::new(
            crate::hardware::Hardware::load("h100").unwrap(),
            crate::Model::load("llama3-70b").unwrap(),
        )
        .unwrap();
        matches!(sim.simulate(p, PassSel::Both), Err(SimError::Deadlock(_)))
    }

    /// Regression (bug hunt): two ranks forwarding the same rows to each other at the last
    /// step, or past it, passed (nothing waited for them) and hung the replay; forwarding
    /// rows that came earlier from their holder, at the end, is fine.
    #[test]
    fn regression_a_circle_of_forwards_at_the_end_deadlocks() {
        let batch = Batch::new(0, vec![300, 40, 120, 17, 35]);
        let base = with_ctx(4, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap();
        assert_eq!(verify(&base), vec![]);
        let last = base.ranks[0].steps.len() as u32;
        let rows = base.initial(2).to_vec();
        for at in [last, last + 3] {
            let mut p = base.clone();
            p.transfers.push(Transfer::kv(0, 1, rows.clone(), at, at));
            p.transfers.push(Transfer::kv(1, 0, rows.clone(), at, at));
            let found = verify(&p);
            assert!(
                found.iter().any(|v| v.kind == K::Deadlock
                    && v.message.contains("rank 0 never gets past its end")),
                "{found:?}"
            );
            assert!(engine_deadlocks(&p), "{at}");
            // Rank 2 hands rank 0 the rows first: the forward has them, nothing waits.
            let mut p = base.clone();
            p.transfers.push(Transfer::kv(2, 0, rows.clone(), 0, 1));
            p.transfers.push(Transfer::kv(0, 1, rows.clone(), at, at));
            assert_eq!(verify(&p), vec![], "{at}");
            assert!(!engine_deadlocks(&p), "{at}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The verifier says a plan deadlocks exactly when the simulator's engine runs into
        /// it, on plans of several schemes whose transfers are rescheduled or regrouped at
        /// random (the engine is the oracle).
        #[test]
        fn the_verifier_finds_the_deadlocks_the_engine_does(
            scheme in prop::sample::select(vec!["zigzag", "fcp:reshuffle=true,block=64", "llama3", "hybrid", "ulysses", "ring"]),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 0u32..4, 0u32..6, 0u32..10), 1..12),
        ) {
            let batch = Batch::new(0, vec![300, 40, 120, 17, 35]);
            let mut p = with_ctx(4, Mask::Causal, |ctx| {
                planner_for(scheme).unwrap().plan(&batch, ctx)
            })
            .unwrap();
            let last = p.ranks[0].steps.len() as u32;
            for (i, what, a, b) in edits {
                let k = i.index(p.transfers.len());
                let t = &mut p.transfers[k];
                match what {
                    0 => t.issue_at = a.min(last + 1),
                    1 => t.arrive_by = a.min(last + 1),
                    2 => {
                        // Ids the backward pass's own could collide with, too (bug hunt:
                        // a gradient's call was `id + 2³⁰`).
                        t.collective = Some([0, 1, 2, 1 << 30, u32::MAX][b as usize % 5]);
                        if t.kind == TransferKind::P2p {
                            t.kind = TransferKind::AllToAll;
                        }
                    }
                    _ => {
                        t.issue_at = a.min(b).min(last + 1);
                        t.arrive_by = a.max(b).min(last + 1);
                    }
                }
            }
            let found = verify(&p);
            // A collective carrying outputs and Q or K/V is refused as such; what the engine
            // makes of its backward pass is not the question.
            prop_assume!(!found.iter().any(|v| v.message.contains("one collective moves one way")));
            let said = found.iter().any(|v| v.kind == K::Deadlock);
            prop_assert_eq!(said, engine_deadlocks(&p), "{:?}", found);
        }
    }
}

#[test]
fn regression_a_kv_transfer_narrowed_inside_a_gqa_group_is_refused() {
    // Bug hunt: a `kv` transfer naming half a GQA group verified as moving half the K/V
    // bytes while the executor moved the whole K/V head; readers now agree it is refused.
    let mut p = plan();
    (p.q_heads, p.kv_heads) = (8, 2);
    let i = p
        .transfers
        .iter()
        .position(|t| t.tensor == TransferTensor::Kv)
        .unwrap();
    let split = |p: &Plan| {
        verify(p)
            .into_iter()
            .filter(|v| v.kind == K::BadRange && v.message.contains("split a GQA group"))
            .map(|v| v.message)
            .collect::<Vec<_>>()
    };
    for whole in [(0, 4), (4, 8), (0, 8)] {
        p.transfers[i].heads = Some(HeadRange::from(whole));
        assert!(split(&p).is_empty(), "{whole:?} is whole groups");
    }
    p.transfers[i].heads = Some(HeadRange::from((2, 5)));
    let found = split(&p);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("its heads are [0, 8)"), "{}", found[0]);
    // Query heads and outputs are per query head: any range is fine there.
    p.transfers[i].tensor = TransferTensor::Q;
    assert!(split(&p).is_empty());
}

/// Regressions (bug hunt): partial outputs move, they are not copied. A duplicated `out`
/// transfer (a reader merging both copies counts those rows twice) and an owner's finished
/// rows sent to a rank that keeps them both passed the verifier, numeric check included, and
/// failed the replay.
#[test]
fn regression_outputs_are_handed_over_once_and_end_with_their_rows() {
    let batch = Batch::new(0, vec![5, 64, 200, 1]);
    let ulysses = with_ctx(4, Mask::Causal, |ctx| {
        crate::planners::Ulysses.plan(&batch, ctx)
    })
    .unwrap();
    assert_eq!(verify(&ulysses), vec![]);
    let mut dup = ulysses.clone();
    let o = dup
        .transfers
        .iter()
        .find(|t| t.tensor == TransferTensor::Out)
        .unwrap()
        .clone();
    dup.transfers.push(o.clone());
    let vs = verify(&dup);
    assert!(!vs.is_empty());
    assert!(
        vs.iter().all(|v| v.kind == K::BadTransfer
            && v.message.contains(&format!(
                "transfer {} → {} hands over the output of",
                o.src, o.dst
            ))
            && v.message.contains("has handed it over already")),
        "{vs:?}"
    );
    // The same as a p2p transfer without the collective id.
    let mut dup = ulysses.clone();
    dup.transfers.push(Transfer {
        kind: crate::plan::TransferKind::P2p,
        collective: None,
        ..o
    });
    assert!(kinds(&dup).contains(&K::BadTransfer));

    // Zigzag's rank 0 sends its own finished rows to rank 2, which keeps them.
    let mut away = plan();
    let steps = away.ranks[0].steps.len() as u32;
    let own = away.ranks[0].owned[0];
    away.transfers.push(Transfer {
        tensor: TransferTensor::Out,
        ..Transfer::kv(0, 2, vec![own], steps, steps)
    });
    let vs = verify(&away);
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(vs[0].kind, K::OutputNotReturned);
    assert!(
        vs[0].message.starts_with(&format!(
            "rank 2 ends holding partial outputs of {} heads [0, {})",
            fmt_range(&own),
            away.q_heads
        )),
        "{}",
        vs[0].message
    );
    // Sent back to rank 0 by rank 2 a step later, the detour is valid.
    let back = Transfer {
        tensor: TransferTensor::Out,
        ..Transfer::kv(2, 0, vec![own], steps + 1, steps + 1)
    };
    away.transfers.push(back.clone());
    assert_eq!(verify(&away), vec![]);
    // At the same step, each send waits for the other's delivery (the replay hung on it).
    *away.transfers.last_mut().unwrap() = Transfer {
        issue_at: steps,
        arrive_by: steps,
        ..back
    };
    let vs = verify(&away);
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(vs[0].kind, K::Deadlock);
}

/// Regression: a call that carries queries out and their outputs back (refused as mixing the
/// two) was also read as relaying what it delivers, one message per piece: a rank's own rows
/// go out as `q` and come back as `out`, which is no relay.
#[test]
fn regression_a_call_mixing_queries_and_outputs_is_not_a_relay() {
    let batch = Batch::new(0, vec![5, 64, 200, 1]);
    let mut p = with_ctx(4, Mask::Causal, |ctx| {
        crate::planners::Ulysses.plan(&batch, ctx)
    })
    .unwrap();
    let id = p
        .transfers
        .iter()
        .find(|t| t.tensor == TransferTensor::Q)
        .and_then(|t| t.collective)
        .unwrap();
    for t in p
        .transfers
        .iter_mut()
        .filter(|t| t.tensor == TransferTensor::Out)
    {
        t.kind = crate::plan::TransferKind::AllToAll;
        t.collective = Some(id);
    }
    let vs = verify(&p);
    assert!(
        vs.iter().any(|v| v.message.contains("carries both")),
        "{vs:?}"
    );
    assert!(
        !vs.iter().any(|v| v.message.contains("same call delivers")),
        "{vs:?}"
    );
}
