//! Property tests: every plan of every scheme verifies, structurally and numerically, on random
//! batches; and the verifier notices any single task removed or duplicated (the structural
//! check is an exact oracle for coverage, the numeric one an independent second opinion).

mod support;

use fcp::hardware::Hardware;
use fcp::plan::{check_numeric, verify, Mask, NumericOptions, ViolationKind};
use fcp::planners::{planner_for, PlanContext, SCHEMES};
use fcp::sim::{waits, PassSel, Simulator};
use fcp::trace::Batch;
use fcp::Model;
use proptest::prelude::*;

/// Long-tailed lengths: mostly short, sometimes 1 token, sometimes long.
fn doc_len() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..8,
        5 => 8u64..200,
        2 => 200u64..2000,
    ]
}

fn with_ctx<R>(ranks: u32, mask: Mask, f: impl FnOnce(&PlanContext<'_>) -> R) -> R {
    let hw = Hardware::load("h100").expect("bundled profile");
    let model = Model::load("llama3-8b").expect("bundled model");
    let ctx = PlanContext {
        ranks,
        tokens_per_rank: 4096,
        mask,
        model: &model,
        hardware: &hw,
        judge: fcp::planners::Judge::default(),
    };
    f(&ctx)
}

/// The simulator of the context [`with_ctx`] plans in.
fn h100_sim() -> Simulator {
    Simulator::new(
        Hardware::load("h100").expect("bundled profile"),
        Model::load("llama3-8b").expect("bundled model"),
    )
    .expect("bundled profile and model")
}

/// The plan, or `None` where the scheme cannot run the batch for a documented reason (Ulysses
/// needs the query heads divisible by N); any other failure, or a refusal that does not say
/// why, fails the test.
fn plan_with(scheme: &str, batch: &Batch, ranks: u32, mask: Mask) -> Option<fcp::Plan> {
    with_ctx(ranks, mask, |ctx| plan_in(scheme, batch, ctx))
}

/// [`plan_with`] in a given context.
fn plan_in(scheme: &str, batch: &Batch, ctx: &PlanContext<'_>) -> Option<fcp::Plan> {
    let result = planner_for(scheme)
        .expect("registered scheme")
        .plan(batch, ctx);
    match result {
        Ok(plan) => Some(plan),
        Err(e) if scheme == "ulysses" && e.to_string().contains("divisible by N") => None,
        Err(e) => panic!("{scheme}: planning failed: {e}"),
    }
}

/// CP sizes: the small ones often, and 16 (the acceptance set is {1, 2, 4, 8, 16}).
fn ranks_strategy(max: u32) -> impl Strategy<Value = u32> {
    prop_oneof![9 => 1u32..max, 1 => Just(16u32)]
}

/// A 1F1B schedule's length by brute force, the oracle for [`fcp::sim::pipeline`]: write
/// each stage's op list out in Megatron's order and relax every op's start (its stage's
/// previous op, its input plus a send) until no end time moves.
fn relaxed_1f1b(
    p: usize,
    work: &[fcp::sim::pipeline::StageWork],
    hop: f64,
    head: fcp::sim::pipeline::StageWork,
) -> f64 {
    use std::collections::HashMap;
    let m = work.len();
    let ops = |s: usize| {
        let warm = (p - 1 - s).min(m);
        let mut v: Vec<(bool, usize)> = (0..warm).map(|i| (true, i)).collect();
        for j in 0..m - warm {
            v.push((true, warm + j));
            v.push((false, j));
        }
        v.extend((m - warm..m).map(|i| (false, i)));
        v
    };
    let mut end: HashMap<(bool, usize, usize), f64> = HashMap::new();
    loop {
        let mut moved = false;
        for s in 0..p {
            let mut t = 0.0f64;
            for (f, i) in ops(s) {
                let get = |k| end.get(&k).copied().unwrap_or(0.0);
                let dep = match (f, s) {
                    (true, 0) => 0.0,
                    (true, _) => get((true, s - 1, i)) + hop,
                    (false, _) if s == p - 1 => get((true, s, i)),
                    (false, _) => get((false, s + 1, i)) + hop,
                };
                let last = if s == p - 1 { head } else { Default::default() };
                let e = t.max(dep)
                    + if f {
                        work[i].forward_ms + last.forward_ms
                    } else {
                        work[i].backward_ms + last.backward_ms
                    };
                if end.insert((f, s, i), e) != Some(e) {
                    moved = true;
                }
                t = e;
            }
        }
        if !moved {
            return end.values().copied().fold(0.0, f64::max);
        }
    }
}

/// The interleaved 1F1B schedule the slow way, for the property test: Megatron's schedule
/// table written out (groups of `p` micro-batches, each through chunk 0, then chunk 1, …),
/// each stage's op list from its warm-up count, and every op's end relaxed over the
/// virtual stages `chunk·p + stage` until nothing moves.
fn relaxed_interleaved(p: usize, v: usize, loads: &[fcp::sim::pipeline::Load]) -> f64 {
    use std::collections::HashMap;
    let m = loads.len();
    let mut table = Vec::new();
    for first in (0..m).step_by(p) {
        for chunk in 0..v {
            for i in first..(first + p).min(m) {
                table.push((i, chunk));
            }
        }
    }
    let total = table.len();
    // (forward, micro-batch, virtual stage) of each op of stage s, in order.
    let ops = |s: usize| {
        let warm = if v == 1 {
            p - 1 - s
        } else {
            2 * (p - 1 - s) + (v - 1) * p
        }
        .min(total);
        let fwd = |k: usize| (true, table[k].0, table[k].1 * p + s);
        let bwd = |k: usize| (false, table[k].0, (v - 1 - table[k].1) * p + s);
        let mut list: Vec<(bool, usize, usize)> = (0..warm).map(fwd).collect();
        for k in 0..total - warm {
            list.push(fwd(warm + k));
            list.push(bwd(k));
        }
        list.extend((total - warm..total).map(bwd));
        list
    };
    let last = p * v - 1;
    let mut end: HashMap<(bool, usize, usize), f64> = HashMap::new();
    loop {
        let mut moved = false;
        for s in 0..p {
            let mut t = 0.0f64;
            for (f, i, g) in ops(s) {
                let l = loads[i];
                let get = |k| end.get(&k).copied().unwrap_or(0.0);
                let dep = match (f, g) {
                    (true, 0) => 0.0,
                    (true, _) => get((true, i, g - 1)) + l.send_ms,
                    (false, _) if g == last => get((true, i, g)),
                    (false, _) => get((false, i, g + 1)) + l.send_ms,
                };
                let head = if g == last {
                    l.head
                } else {
                    Default::default()
                };
                let e = t.max(dep)
                    + if f {
                        l.work.forward_ms / v as f64 + head.forward_ms
                    } else {
                        l.work.backward_ms / v as f64 + head.backward_ms
                    };
                if end.insert((f, i, g), e) != Some(e) {
                    moved = true;
                }
                t = e;
            }
        }
        if !moved {
            return end.values().copied().fold(0.0, f64::max);
        }
    }
}

proptest! {
    #![proptest_config(support::proptest_config())]

    #[test]
    fn every_plan_verifies(
        lens in prop::collection::vec(doc_len(), 1..12),
        ranks in ranks_strategy(10),
        causal in any::<bool>(),
    ) {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        let batch = Batch::new(0, lens);
        // Every scheme, `hybrid`'s quick search, whose candidates differ from the full one's,
        // and `usp` with its rings inside a node, whose ranks are renumbered.
        for scheme in SCHEMES.iter().chain(&["hybrid:quick=true", "usp:inner=ring"]) {
            let Some(plan) = plan_with(scheme, &batch, ranks, mask) else { continue };
            let v = verify(&plan);
            prop_assert!(v.is_empty(), "{scheme}: {v:?}");
            let opts = NumericOptions { max_rows_per_doc: 64, ..NumericOptions::default() };
            let r = check_numeric(&plan, &opts).unwrap();
            prop_assert!(r.max_abs_error < 1e-9, "{scheme}: {r:?}");
        }
    }

    /// `usp` against `zigzag` as its oracle: both cut every document the same way (2N pieces,
    /// rank k holding k and 2N − 1 − k), so a Ulysses group's ranks share exactly the work
    /// zigzag gives the same ranks, each 1/u of it over its own head group; and `ulysses=1`
    /// is zigzag itself, tile for tile and hop for hop.
    #[test]
    fn usp_splits_zigzag_s_work_evenly_inside_each_group(
        lens in prop::collection::vec(doc_len(), 1..10),
        (ranks, u) in prop_oneof![
            Just((1u32, 1u32)), Just((2, 1)), Just((2, 2)), Just((4, 2)), Just((4, 4)),
            Just((6, 2)), Just((8, 4)), Just((8, 8)), Just((16, 8)),
        ],
        causal in any::<bool>(),
    ) {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        let batch = Batch::new(0, lens);
        let zz = plan_with("zigzag", &batch, ranks, mask).expect("zigzag plans");
        let usp = plan_with(&format!("usp:ulysses={u}"), &batch, ranks, mask).expect("usp plans");
        let model = Model::load("llama3-8b").expect("bundled model");
        let flops = |p: &fcp::Plan| -> Vec<f64> {
            fcp::plan::summarize(p, &model).per_rank.iter().map(|r| r.flops).collect()
        };
        let (z, s) = (flops(&zz), flops(&usp));
        for g in 0..(ranks / u) as usize {
            let group = g * u as usize..(g + 1) * u as usize;
            let share = z[group.clone()].iter().sum::<f64>() / f64::from(u);
            for k in group {
                prop_assert!((s[k] - share).abs() <= 1e-9 * share.max(1.0), "rank {k}: {} vs {share}", s[k]);
            }
        }
        if u == 1 {
            prop_assert_eq!(&usp.ranks, &zz.ranks);
            prop_assert_eq!(&usp.transfers, &zz.transfers);
        }
    }

    /// A rank's waits split into time with a message of its own in flight and time waiting on
    /// a peer, and the two add up to the engine's exposed time to the nanosecond, on every
    /// scheme's plans, both passes.
    #[test]
    fn waits_split_the_exposed_time_exactly(
        lens in prop::collection::vec(doc_len(), 1..10),
        ranks in ranks_strategy(8),
        causal in any::<bool>(),
    ) {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        let batch = Batch::new(0, lens);
        let sim = h100_sim();
        for scheme in SCHEMES {
            let Some(plan) = plan_with(scheme, &batch, ranks, mask) else { continue };
            let (report, outcomes) = sim.simulate_traced(&plan, PassSel::Both).unwrap();
            for o in &outcomes {
                for (r, x) in o.ranks.iter().enumerate() {
                    let (flight, peers) = waits::split_waits(&o.timeline[r], x.finish_ns);
                    prop_assert_eq!(
                        waits::total(&flight) + waits::total(&peers),
                        x.exposed_ns,
                        "{} rank {}", scheme, r
                    );
                }
            }
            for m in &report.ranks {
                prop_assert!(m.waiting_on_peers_ms <= m.exposed_comm_ms + 1e-9, "{scheme}: {m:?}");
            }
        }
    }

    #[test]
    fn removing_or_duplicating_any_task_is_caught(
        lens in prop::collection::vec(doc_len(), 1..6),
        ranks in 1u32..6,
        pick in any::<prop::sample::Index>(),
        duplicate in any::<bool>(),
    ) {
        let batch = Batch::new(0, lens);
        for scheme in SCHEMES {
            let Some(mut plan) = plan_with(scheme, &batch, ranks, Mask::Causal) else { continue };
            let slots: Vec<(usize, usize, usize)> = plan
                .ranks
                .iter()
                .enumerate()
                .flat_map(|(r, rp)| {
                    rp.steps
                        .iter()
                        .enumerate()
                        .flat_map(move |(s, st)| (0..st.tasks.len()).map(move |i| (r, s, i)))
                })
                .collect();
            let (r, s, i) = slots[pick.index(slots.len())];
            let expected = if duplicate {
                let t = plan.ranks[r].steps[s].tasks[i];
                plan.ranks[r].steps[s].tasks.push(t);
                ViolationKind::DuplicatePairs
            } else {
                plan.ranks[r].steps[s].tasks.remove(i);
                ViolationKind::MissingPairs
            };
            let kinds: Vec<_> = verify(&plan).into_iter().map(|v| v.kind).collect();
            prop_assert!(kinds.contains(&expected), "{scheme}: {kinds:?}");
            let num = check_numeric(&plan, &NumericOptions::default()).unwrap();
            prop_assert!(num.max_abs_error > 1e-9, "{scheme}: numeric check missed it: {num:?}");
        }
    }

    #[test]
    fn plans_round_trip_exactly_and_deterministically(
        lens in prop::collection::vec(doc_len(), 1..8),
        ranks in 1u32..8,
    ) {
        let batch = Batch::new(3, lens);
        for scheme in SCHEMES {
            let Some(a) = plan_with(scheme, &batch, ranks, Mask::Causal) else { continue };
            let b = plan_with(scheme, &batch, ranks, Mask::Causal).expect("deterministic");
            let text = a.to_json();
            prop_assert_eq!(&text, &b.to_json());
            let back = fcp::Plan::from_json(&text, "mem").unwrap();
            prop_assert_eq!(&back, &a);
            prop_assert_eq!(back.to_json(), text);
        }
    }

    /// A transfer with `also_to` receivers (an all-gather listing each shard once) reads as its
    /// point-to-point pieces, one per receiver in order: the verifier accepts both forms, and
    /// the simulator reports the same to the bit. Dropping any one receiver is caught.
    #[test]
    fn a_multicast_reads_as_its_point_to_point_pieces(
        lens in prop::collection::vec(doc_len(), 1..10),
        ranks in 3u32..9,
        causal in any::<bool>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        let batch = Batch::new(0, lens);
        let sim = h100_sim();
        let mut multicasts = 0;
        for scheme in SCHEMES {
            let Some(plan) = plan_with(scheme, &batch, ranks, mask) else { continue };
            if plan.delivery_count() == plan.transfers.len() {
                prop_assert_eq!(plan.version, 1, "{}", scheme);
                continue;
            }
            multicasts += 1;
            prop_assert_eq!(plan.version, 2, "{}", scheme);
            let pieces = point_to_point(&plan);
            prop_assert_eq!(pieces.version, 1);
            prop_assert!(verify(&plan).is_empty(), "{scheme}: {:?}", verify(&plan));
            prop_assert!(verify(&pieces).is_empty(), "{scheme}: {:?}", verify(&pieces));
            prop_assert_eq!(
                sim.simulate(&plan, PassSel::Both).unwrap(),
                sim.simulate(&pieces, PassSel::Both).unwrap(),
                "{}", scheme
            );
            // Drop one receiver of one multicast: where a task of that rank reads what it
            // carried (heads included), the verifier says the data is not there.
            let mut cut = plan.clone();
            let multi: Vec<usize> = (0..cut.transfers.len())
                .filter(|&i| !cut.transfers[i].also_to.is_empty())
                .collect();
            let i = multi[pick.index(multi.len())];
            let dropped = cut.transfers[i].also_to.pop().unwrap();
            let t = &cut.transfers[i];
            let heads_meet = |h: Option<fcp::plan::HeadRange>| match (h, t.heads) {
                (Some(a), Some(b)) => a.start < b.end && b.start < a.end,
                _ => true,
            };
            let read = cut.ranks[dropped as usize].steps.iter().flat_map(|s| &s.tasks).any(|x| {
                heads_meet(x.heads)
                    && t.ranges.iter().any(|r| {
                        r.doc == x.kv.doc && r.start < x.kv.end && x.kv.start < r.end
                    })
            });
            if read {
                let kinds: Vec<_> = verify(&cut).into_iter().map(|v| v.kind).collect();
                prop_assert!(kinds.contains(&ViolationKind::NotAvailable), "{scheme}: {kinds:?}");
            }
        }
        // Llama3 CP gathers every shard (padded to N), so 3 ranks or more always multicast.
        prop_assert!(multicasts > 0, "the all-gather schemes emit multicasts");
    }
}

/// Lengths across the kernel tables' edges: below their shortest row (1,024 tokens), inside,
/// and up to four times their longest (32K).
fn table_len() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 1u64..1024,
        2 => 1024u64..32768,
        1 => 32768u64..131072,
    ]
}

proptest! {
    #![proptest_config(support::proptest_config())]

    /// No plan of any scheme spends less compute than the lower bound says the batch needs
    /// (each document whole as one kernel, spread over the ranks): mean rank compute ≥
    /// `lower_bound_ms`, on both bundled hd-128 kernel tables and both masks. The bound is
    /// the oracle; a cost model that prices a cut document below the whole breaks it. Both
    /// such flaws found so far fail this test when put back: full-mask tiles below the tables
    /// clamped to their own shortest row (short documents cut by zigzag, per-doc, wlb-llm),
    /// and causal tiles above them clamped to the 32K row (one 60K document cut in two by
    /// zigzag on one H100 rank, the case kept in the regressions file).
    #[test]
    fn no_plan_computes_for_less_than_the_lower_bound(
        lens in prop::collection::vec(table_len(), 1..6),
        ranks in 1u32..9,
        causal in any::<bool>(),
        b200 in any::<bool>(),
        pass in 0u8..3,
    ) {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        // Full mask: each pass alone too. B200's forward full-mask rate falls with length,
        // which the backward pass hid in `both` (bug hunt: ring read 0.954× its bound, forward
        // only). Causal documents are held to training (`both`): within the tables a measured
        // causal row dips below a shorter one (H100 forward 657 at 8K against 662 at 4K), and
        // forward alone a cut can read a hair under the bound (llama3 on H100, documents of
        // 106,424, 101,927 and 5,109 tokens over 5 ranks: 51.302 against 51.311 ms, 0.02 %;
        // cost-model.md § Not modelled bounds this by the tables' 1.9 %).
        let pass = if causal {
            PassSel::Both
        } else {
            [PassSel::Fwd, PassSel::Bwd, PassSel::Both][usize::from(pass)]
        };
        let total: u64 = lens.iter().sum();
        let batch = Batch::new(0, lens);
        let hw = Hardware::load(if b200 { "b200" } else { "h100" }).unwrap();
        let model = Model::load("llama3-8b").unwrap();
        let sim = Simulator::new(hw.clone(), model.clone()).unwrap();
        let ctx = PlanContext {
            ranks,
            tokens_per_rank: 2 * total.div_ceil(u64::from(ranks)),
            mask,
            model: &model,
            hardware: &hw,
            judge: fcp::planners::Judge::default(),
        };
        for scheme in SCHEMES.iter().chain(&["hybrid:quick=true"]) {
            let Some(plan) = plan_in(scheme, &batch, &ctx) else { continue };
            let m = sim.simulate(&plan, pass).unwrap().metrics;
            prop_assert!(
                m.mean_compute_ms >= m.lower_bound_ms * (1.0 - 1e-9),
                "{scheme} on {} ({pass:?}): mean compute {} ms < bound {} ms", hw.name, m.mean_compute_ms, m.lower_bound_ms
            );
        }
    }
}

/// `plan` with every transfer listed once per receiver, as plan format version 1 lists an
/// all-gather.
fn point_to_point(plan: &fcp::Plan) -> fcp::Plan {
    let mut out = plan.clone();
    out.transfers = plan
        .deliveries()
        .map(|d| fcp::plan::Transfer {
            dst: d.dst,
            also_to: Vec::new(),
            ..d.transfer.clone()
        })
        .collect();
    out.version = out.required_version();
    out
}

/// One GPU's share of Llama-3-8B on an H100 node under TP `tp`.
fn llama3_8b_on_h100(tp: u32) -> (Hardware, Model) {
    fcp::tp::split(
        &Hardware::load("h100").unwrap(),
        &Model::load("llama3-8b").unwrap(),
        tp,
    )
    .unwrap()
}

/// A causal CP group of `ranks` ranks of 4,096 tokens.
fn causal_4096<'a>(ranks: u32, hw: &'a Hardware, model: &'a Model) -> PlanContext<'a> {
    PlanContext {
        ranks,
        tokens_per_rank: 4096,
        mask: Mask::Causal,
        model,
        hardware: hw,
        judge: fcp::planners::Judge::default(),
    }
}

proptest! {
    #![proptest_config(support::proptest_config())]

    /// Under tensor parallelism (one GPU's share of llama3-8b, 2 to 8 ways) every scheme's
    /// plan verifies on random batches, records its split, and its whole layer holds the TP
    /// collectives: the rank with the most tokens runs the most GEMM work and the longest
    /// collectives (both grow with tokens), back to back on its compute stream, so the layer
    /// takes at least the two together.
    #[test]
    fn tp_plans_verify_and_their_layer_holds_the_collectives(
        lens in prop::collection::vec(doc_len(), 1..10),
        ranks in 1u32..9,
        tp in prop_oneof![Just(2u32), Just(4), Just(8)],
    ) {
        let (hw, model) = llama3_8b_on_h100(tp);
        let sim = Simulator::new(hw.clone(), model.clone()).unwrap().with_layer().unwrap();
        let ctx = causal_4096(ranks, &hw, &model);
        let batch = Batch::new(0, lens);
        for scheme in SCHEMES.iter().chain(&["hybrid:quick=true"]) {
            let Some(plan) = plan_in(scheme, &batch, &ctx) else { continue };
            prop_assert!(verify(&plan).is_empty(), "{scheme}: {:?}", verify(&plan));
            prop_assert_eq!(plan.tp, Some(tp));
            prop_assert_eq!(plan.q_heads, 32 / tp);
            let m = sim.simulate(&plan, PassSel::Both).unwrap().metrics;
            let l = m.layer.unwrap();
            let tp_ms = l.tp_comm_max_ms.unwrap();
            prop_assert!(tp_ms > 0.0, "{scheme}");
            prop_assert!(
                l.layer_time_ms >= (l.linear_max_ms + tp_ms) * (1.0 - 1e-9),
                "{scheme}: layer {} < linear {} + TP {}", l.layer_time_ms, l.linear_max_ms, tp_ms
            );
        }
    }

    /// What a GPU holds over a training step, on every scheme's plan of random batches: the
    /// parts add up and the verdict follows them; the fullest GPU holds at least the model
    /// state and the fullest rank's activations of every layer; and each lever shrinks it
    /// (recomputing more, sharding more, pipelining), never grows it.
    #[test]
    fn a_gpus_training_footprint_adds_up_and_every_lever_shrinks_it(
        lens in prop::collection::vec(doc_len(), 1..10),
        ranks in 1u32..9,
        tp in prop_oneof![Just(1u32), Just(2)],
    ) {
        use fcp::footprint::{Counter, RankLoad, Training};
        use fcp::model::Recompute;
        let (hw, model) = llama3_8b_on_h100(tp);
        let ctx = causal_4096(ranks, &hw, &model);
        let batch = Batch::new(0, lens);
        let hbm = hw.hbm_bytes();
        let base = Training::default();
        for scheme in SCHEMES {
            let Some(plan) = plan_in(scheme, &batch, &ctx) else { continue };
            let mut totals = Vec::new();
            for recompute in [Recompute::None, Recompute::Mlp, Recompute::Full] {
                let sim = Simulator::new(hw.clone(), model.clone())
                    .unwrap()
                    .with_recompute(recompute)
                    .unwrap()
                    .with_training(base)
                    .unwrap();
                let r = sim.simulate(&plan, PassSel::Both).unwrap();
                let l = r.metrics.layer.as_ref().unwrap();
                let f = l.footprint.unwrap();
                let parts = f.weight_bytes + f.grad_bytes + f.optimizer_bytes
                    + f.gathered_bytes + f.activation_bytes + f.transient_bytes;
                prop_assert_eq!(f.total_bytes, parts, "{}", scheme);
                prop_assert_eq!(f.fits, hbm.map(|h| parts <= h));
                prop_assert!(f.activation_bytes <= 32 * l.act_max_bytes, "{}", scheme);
                prop_assert!(f.total_bytes >= f.state_bytes() + 32 * l.act_max_bytes, "{}", scheme);
                totals.push(f.total_bytes);
                // The same ranks under other settings, from the library directly.
                let tokens = plan.tokens_per_rank();
                let loads: Vec<RankLoad> = r.ranks.iter().zip(&tokens).map(|(x, &t)| RankLoad {
                    rank: x.rank,
                    tokens: t,
                    attention_bytes: x.mem_bytes,
                }).collect();
                let of = |training| {
                    Counter {
                        model: &model,
                        training,
                        recompute,
                        cp: plan.num_ranks,
                        hbm_bytes: hbm,
                    }
                    .fullest(&loads)
                    .unwrap()
                    .unwrap()
                    .total_bytes
                };
                let at = |zero, dp, pp| of(Training::new(zero, dp, pp).unwrap());
                // Hybrid sharding over 2 of 8 replicas holds what sharding over 2 alone does.
                for zero in 1..=3 {
                    let hsdp = Training::new(zero, 8, 1).unwrap().with_shard_dp(2).unwrap();
                    prop_assert_eq!(of(hsdp), at(zero, 2, 1), "{}", scheme);
                }
                prop_assert_eq!(at(1, 1, 1), f.total_bytes);
                prop_assert!(at(0, 1, 1) >= at(1, 1, 1) && at(1, 1, 1) >= at(2, 1, 1), "{}", scheme);
                prop_assert!(at(2, 8, 1) <= at(2, 1, 1), "{}", scheme);
                prop_assert!(at(1, 1, 4) <= at(1, 1, 1) && at(1, 1, 32) <= at(1, 1, 4), "{}", scheme);
            }
            prop_assert!(totals[0] >= totals[1] && totals[1] >= totals[2], "{}: {:?}", scheme, totals);
        }
    }

    /// ZeRO 3 on every scheme's plan of random batches: gathering each layer's weights never
    /// makes the layer faster; it ends no earlier than its collectives, later than without
    /// them by exactly what they leave exposed, and leaves attention as planned alone.
    #[test]
    fn zero_3_gathers_cost_a_layer_exactly_what_they_leave_exposed(
        lens in prop::collection::vec(doc_len(), 1..10),
        ranks in 1u32..9,
        dp in prop_oneof![Just(1u32), Just(2), Just(64)],
        full in any::<bool>(),
    ) {
        use fcp::footprint::Training;
        use fcp::model::Recompute;
        let (hw, model) = llama3_8b_on_h100(1);
        let ctx = causal_4096(ranks, &hw, &model);
        let batch = Batch::new(0, lens);
        let recompute = if full { Recompute::Full } else { Recompute::None };
        let sim = |zero| {
            Simulator::new(hw.clone(), model.clone())
                .unwrap()
                .with_recompute(recompute)
                .unwrap()
                .with_training(Training::new(zero, dp, 1).unwrap())
                .unwrap()
        };
        let (two, three) = (sim(2), sim(3));
        for scheme in SCHEMES {
            let Some(plan) = plan_in(scheme, &batch, &ctx) else { continue };
            let r2 = two.simulate(&plan, PassSel::Both).unwrap();
            let r3 = three.simulate(&plan, PassSel::Both).unwrap();
            let (l2, l3) = (r2.metrics.layer.unwrap(), r3.metrics.layer.unwrap());
            prop_assert_eq!(l2.zero3_comm_ms, None);
            // One GPU in all shards and gathers nothing: ZeRO 3 is ZeRO 2 there.
            if dp * plan.num_ranks == 1 {
                prop_assert_eq!(l3.zero3_comm_ms, None);
                prop_assert_eq!(l3.layer_time_ms, l2.layer_time_ms);
                continue;
            }
            let comm = l3.zero3_comm_ms.unwrap();
            let exposed = l3.zero3_exposed_ms.unwrap();
            prop_assert!(exposed >= 0.0 && exposed <= comm, "{}: {} of {}", scheme, exposed, comm);
            prop_assert!(l3.layer_time_ms + 1e-9 >= l2.layer_time_ms.max(comm), "{}", scheme);
            prop_assert!((l3.layer_time_ms - (l2.layer_time_ms + exposed)).abs() < 1e-6, "{}: {} vs {} + {}", scheme, l3.layer_time_ms, l2.layer_time_ms, exposed);
            prop_assert!(l3.layer_vs_lower_bound >= 1.0 - 1e-9, "{}", scheme);
            prop_assert_eq!(r3.metrics.attention_time_ms, r2.metrics.attention_time_ms);
            // No rank ends the layer after it ends, nor earlier under ZeRO 3 than without.
            for (x2, x3) in r2.ranks.iter().zip(&r3.ranks) {
                let (e2, e3) = (x2.layer_end_ms.unwrap(), x3.layer_end_ms.unwrap());
                prop_assert!(e3 + 1e-9 >= e2 && e3 <= l3.layer_time_ms + 1e-6, "{}: {} {}", scheme, e2, e3);
            }
        }
    }

    /// A training step on every scheme's plan of random batches, under every ZeRO stage:
    /// its time is the micro-batches' and bubble's layer times plus the data-parallel
    /// collectives it leaves exposed; overlapping never exposes more; more micro-batches
    /// never train fewer tokens per GPU-second (the bubble and the reduction amortise).
    #[test]
    fn a_step_is_its_layers_and_what_data_parallelism_leaves_exposed(
        lens in prop::collection::vec(doc_len(), 1..10),
        ranks in 1u32..9,
        zero in 0u8..4,
        dp in prop_oneof![Just(1u32), Just(2), Just(16)],
        pp in prop_oneof![Just(1u32), Just(2), Just(8)],
        extra in 0u32..9,
    ) {
        use fcp::footprint::Training;
        use fcp::sim::step::{MicroBatch, StepOptions};
        let (hw, model) = llama3_8b_on_h100(1);
        let ctx = causal_4096(ranks, &hw, &model);
        let batch = Batch::new(0, lens);
        let training = Training::new(zero, dp, pp).unwrap();
        let sim = Simulator::new(hw.clone(), model.clone())
            .unwrap()
            .with_layer()
            .unwrap()
            .with_training(training)
            .unwrap();
        let m = pp + extra;
        let tokens = batch.tokens() as f64;
        for scheme in SCHEMES {
            let Some(plan) = plan_in(scheme, &batch, &ctx) else { continue };
            let layer = sim.simulate(&plan, PassSel::Both).unwrap().metrics.layer.unwrap();
            let window = [MicroBatch::of(&layer, tokens)];
            let step = |m, overlap| {
                sim.step(&window, plan.num_ranks, StepOptions::new(m, overlap, training).unwrap())
                    .unwrap()
            };
            let (plain, over) = (step(m, false), step(m, true));
            let slot = f64::from(32 / pp) * layer.layer_time_ms;
            // Equal micro-batches: (m + P − 1) slots, the last stage's output layer on each
            // micro-batch, and the sends between stages on top.
            let head = plain.output_layer_ms;
            prop_assert!(head > 0.0, "{}", scheme);
            let slots = f64::from(m + pp - 1) * slot + f64::from(m) * head;
            prop_assert!(plain.pipeline_ms + 1e-6 >= slots + 2.0 * f64::from(pp - 1) * plain.pp_send_ms, "{}", scheme);
            prop_assert_eq!(plain.pp_send_ms > 0.0, pp > 1);
            if pp == 1 {
                prop_assert!((plain.pipeline_ms - slots).abs() < 1e-6, "{}", scheme);
            }
            let busiest = f64::from(m) * (slot + head);
            prop_assert!((plain.bubble_ms - (plain.pipeline_ms - busiest)).abs() < 1e-6, "{}", scheme);
            prop_assert!((plain.step_ms - plain.pipeline_ms - plain.dp_exposed_ms - plain.optimizer_ms).abs() < 1e-6, "{}", scheme);
            prop_assert!(plain.optimizer_ms > 0.0, "{}", scheme);
            prop_assert_eq!(plain.dp_exposed_ms, plain.dp_comm_ms);
            prop_assert!(over.dp_exposed_ms >= 0.0 && over.dp_exposed_ms <= plain.dp_exposed_ms + 1e-9, "{}", scheme);
            // One GPU per weight has nothing to sum.
            if dp * plan.num_ranks == 1 {
                prop_assert_eq!(plain.dp_comm_ms, 0.0);
            }
            let more = step(m + 4, false);
            prop_assert!(more.tokens_per_gpu_s + 1e-9 >= plain.tokens_per_gpu_s, "{}: {:?} {:?}", scheme, plain, more);
        }
    }

    /// The 1F1B schedule of random micro-batches, checked against what any schedule of
    /// them must respect: equal micro-batches take the closed form's `(m + P − 1)` slots;
    /// otherwise no less than one stage's work plus the first forward's and the last
    /// backward's trips through the other stages, no more than running every op of every
    /// stage one after another; and making any micro-batch heavier never makes it faster.
    #[test]
    fn the_1f1b_pipeline_respects_its_bounds(
        work in prop::collection::vec((1u32..50, 1u32..100), 1..24),
        stages in 1u32..9,
        hop in 0u32..5,
        heavier in 0usize..24,
    ) {
        use fcp::sim::pipeline::{one_f_one_b, one_f_one_b_with_head, StageWork};
        let w: Vec<StageWork> = work
            .iter()
            .map(|&(f, b)| StageWork { forward_ms: f64::from(f), backward_ms: f64::from(b) })
            .collect();
        let (p, h) = (f64::from(stages), f64::from(hop));
        let t = one_f_one_b(stages, &w, h);
        let busy: f64 = w.iter().map(StageWork::total_ms).sum();
        let lower = busy + (p - 1.0) * (w[0].forward_ms + w[w.len() - 1].backward_ms + 2.0 * h);
        prop_assert!(t + 1e-9 >= lower, "{} < {}", t, lower);
        prop_assert!(t <= p * busy + 2.0 * (p - 1.0) * h * w.len() as f64 + 1e-9);
        if stages == 1 {
            prop_assert_eq!(t, busy);
        }
        let even = vec![w[0]; w.len()];
        prop_assert_eq!(
            one_f_one_b(stages, &even, 0.0),
            (w.len() as f64 + p - 1.0) * w[0].total_ms()
        );
        // The naive oracle: relax every op's start until nothing moves.
        let zero = StageWork::default();
        prop_assert!((t - relaxed_1f1b(stages as usize, &w, h, zero)).abs() < 1e-9);
        // With the last stage's output layer too.
        let head = StageWork { forward_ms: f64::from(hop) * 3.0, backward_ms: heavier as f64 };
        let with = one_f_one_b_with_head(stages, &w, h, head);
        prop_assert!((with - relaxed_1f1b(stages as usize, &w, h, head)).abs() < 1e-9);
        prop_assert!(with + 1e-9 >= t.max(busy + w.len() as f64 * head.total_ms()));
        let mut more = w.clone();
        let k = heavier % w.len();
        more[k].backward_ms += 7.0;
        prop_assert!(one_f_one_b(stages, &more, h) + 1e-9 >= t);
    }

    /// The interleaved schedule of random micro-batches against the slow oracle, and against
    /// what it must respect: one chunk is the plain schedule; equal micro-batches take
    /// `m + (P − 1)/v` slots; never less than the last stage's work; never slower for
    /// lighter micro-batches.
    #[test]
    fn the_interleaved_pipeline_matches_its_oracle(
        work in prop::collection::vec((1u32..50, 1u32..100, 0u32..9, 0u32..3), 1..5),
        stages in 2u32..5,
        chunks in 1u32..4,
        groups in 1usize..4,
    ) {
        use fcp::sim::pipeline::{interleaved, schedule, Load, StageWork};
        let m = stages as usize * groups;
        let loads: Vec<Load> = (0..m)
            .map(|i| {
                let (f, b, h, send) = work[i % work.len()];
                Load {
                    work: StageWork { forward_ms: f64::from(f * 6), backward_ms: f64::from(b * 6) },
                    head: StageWork { forward_ms: f64::from(h), backward_ms: f64::from(2 * h) },
                    send_ms: f64::from(send) * 0.5,
                }
            })
            .collect();
        let t = interleaved(stages, chunks, &loads);
        let oracle = relaxed_interleaved(stages as usize, chunks as usize, &loads);
        prop_assert!((t - oracle).abs() < 1e-6, "{} vs oracle {}", t, oracle);
        if chunks == 1 {
            prop_assert_eq!(t, schedule(stages, &loads));
        }
        let busy: f64 = loads.iter().map(|l| l.work.total_ms() + l.head.total_ms()).sum();
        prop_assert!(t + 1e-9 >= busy);
        let even = vec![Load { work: loads[0].work, ..Load::default() }; m];
        let slots = m as f64 + f64::from(stages - 1) / f64::from(chunks);
        prop_assert!((interleaved(stages, chunks, &even) - slots * loads[0].work.total_ms()).abs() < 1e-6);
        let lighter: Vec<Load> = loads
            .iter()
            .map(|l| Load { work: StageWork { forward_ms: l.work.forward_ms / 2.0, ..l.work }, ..*l })
            .collect();
        prop_assert!(interleaved(stages, chunks, &lighter) <= t + 1e-9);
    }

    /// A step over random windows, under every order and deal: the same tokens whichever
    /// replica trains which window in which order, the same work behind every order, no
    /// replica slower than the step, and never faster than an even share of the work.
    #[test]
    fn a_step_trains_its_windows_whichever_way_they_are_dealt_and_ordered(
        times in prop::collection::vec((2u32..200, 1u32..100), 1..12),
        dp in 1u32..5,
        pp in 1u32..5,
        extra in 0u32..6,
        send in 0u32..3,
    ) {
        use fcp::footprint::Training;
        use fcp::sim::step::{
            step_metrics, Deal, DpSync, MicroBatch, MicroBatchOrder, StageExtras, StageWork, StepOptions,
        };
        // Each window's output layer and sends grow with its tokens.
        let windows: Vec<MicroBatch> = times
            .iter()
            .map(|&(t, tok)| MicroBatch {
                layer_ms: f64::from(t),
                backward_ms: f64::from(t) * 0.6,
                tokens: f64::from(tok),
                rank_tokens: u64::from(tok),
                extras: StageExtras {
                    send_ms: f64::from(send * tok) * 0.01,
                    head: StageWork { forward_ms: f64::from(tok) * 0.07, backward_ms: f64::from(tok) * 0.14 },
                },
                nic_ms: [0.0; 2],
            })
            .collect();
        // Interleaved over two chunks of one layer where a pipeline allows it, in groups of
        // the stages.
        let interleave = pp > 1 && extra % 2 == 1;
        let training = Training::new(1, dp, pp)
            .unwrap()
            .with_virtual_stages(if interleave { 2 } else { 1 })
            .unwrap();
        let m = if interleave { pp * (1 + extra / 2) } else { pp + extra };
        let none = DpSync::default();
        let mut tokens = Vec::new();
        for deal in [Deal::Stream, Deal::Lpt] {
            let mut work = Vec::new();
            for order in MicroBatchOrder::ALL {
                let o = StepOptions::new(m, false, training)
                    .unwrap()
                    .with_order(order)
                    .with_deal(deal, training)
                    .unwrap();
                let s = step_metrics(&windows, 2, training, none, o, 1);
                prop_assert!(s.dp_wait_ms >= 0.0 && s.bubble_ms >= 0.0);
                if pp == 1 {
                    prop_assert!(s.bubble_ms.abs() < 1e-9, "{:?}", s);
                }
                // Every micro-batch of the step, each through 2 layers, shared evenly.
                let all: f64 = (0..(dp * m) as usize)
                    .map(|k| 2.0 * windows[k % windows.len()].layer_ms)
                    .sum();
                prop_assert!(s.step_ms + 1e-6 >= all / f64::from(dp), "{:?}", s);
                prop_assert!(s.micro_batch_max_ms + 1e-9 >= s.micro_batch_mean_ms);
                tokens.push(s.tokens_per_gpu_s * s.step_ms);
                work.push(s.pipeline_ms - s.bubble_ms);
            }
            // Only the order of a replica's micro-batches changed: not its work. (Over
            // several replicas another one may become the slowest, with other work.)
            if dp == 1 {
                prop_assert!((work[0] - work[1]).abs() < 1e-6, "{:?}", work);
            }
        }
        for t in &tokens {
            prop_assert!((t - tokens[0]).abs() <= 1e-9 * tokens[0].abs().max(1.0), "{:?}", tokens);
        }
    }
}
