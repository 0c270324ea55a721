//! Issue 7: the exact search equals brute force on small instances (and microlp's MILP agrees),
//! never loses to its warm start, returns its incumbent with a gap on a time-out, and its
//! plans verify numerically.

use fcp::hardware::Hardware;
use fcp::ilp::search::{self, Item, Problem};
use fcp::ilp::{self, milp, Mode, Options, Status};
use fcp::plan::{check_numeric, verify, Mask, NumericOptions, Plan};
use fcp::planners::{Fcp, PlanContext};
use fcp::{Batch, Model};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A random problem of `m` items: single-segment pieces of a few documents (`chain`), or
/// multi-segment units.
fn random_problem(rng: &mut ChaCha8Rng, m: usize, n: u32, chain: bool, lambda: f64) -> Problem {
    let mut items = Vec::new();
    let mut doc = 0u32;
    let mut pos = 0u64;
    for k in 0..m {
        if rng.gen_bool(0.35) {
            doc += 1;
            pos = 0;
        }
        let len = rng.gen_range(1..=8u64);
        let mut segs = vec![(doc, pos, len)];
        if !chain && rng.gen_bool(0.3) {
            segs.push((1000 + k as u32, 0, 2));
        }
        let tokens = segs.iter().map(|s| s.2).sum();
        items.push(Item {
            tokens,
            work: (len * (2 * pos + len + 1) / 2) as f64,
            segs,
        });
        pos += len;
    }
    let total: u64 = items.iter().map(|i| i.tokens).sum();
    let slack = rng.gen_range(0..=3u64);
    Problem {
        items,
        ranks: n,
        lo: (total / u64::from(n)).saturating_sub(slack),
        hi: total.div_ceil(u64::from(n)) + slack,
        alpha: 1.0,
        lambda,
        comm_ref: (total / u64::from(n)) as f64,
        load_cap: None,
        chain,
        forced_exchange: Vec::new(),
    }
}

#[test]
fn search_and_milp_equal_brute_force_on_small_instances() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut compared = 0;
    for case in 0..60 {
        let chain = case % 2 == 0;
        let n = 2 + (case % 3) as u32;
        let m = rng.gen_range(3..=if n == 4 { 8 } else { 10 });
        let lambda = [0.0, 0.1, 1.0][case % 3];
        let mut p = random_problem(&mut rng, m, n, chain, lambda);
        if case % 5 == 4 {
            // min-comm mode
            p.alpha = 0.0;
            p.lambda = 1.0;
            p.load_cap = Some(1.3);
        }
        let Some((_, brute)) = search::brute_force(&p) else {
            let o = search::solve(&p, None, 10.0);
            assert!(!o.value.feasible, "case {case}: brute force found nothing");
            continue;
        };
        let o = search::solve(&p, None, 10.0);
        assert_eq!(o.status, Status::Optimal, "case {case}");
        assert!(
            (o.value.objective - brute.objective).abs() < 1e-9,
            "case {case}: search {} vs brute force {}",
            o.value.objective,
            brute.objective
        );
        if m <= 8 {
            let r = milp::solve(&p, None, 20.0).expect("microlp solves a feasible instance");
            assert!(
                (r.objective - brute.objective).abs() < 1e-6,
                "case {case}: microlp {} vs brute force {}",
                r.objective,
                brute.objective
            );
        }
        compared += 1;
    }
    assert!(compared >= 30, "only {compared} feasible cases");
}

fn with_ctx<R>(n: u32, tokens_per_rank: u64, f: impl FnOnce(&PlanContext<'_>) -> R) -> R {
    let hw = Hardware::load("h100").expect("bundled hardware");
    let model = Model::load("llama3-8b").expect("bundled model");
    let ctx = PlanContext {
        ranks: n,
        tokens_per_rank,
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
    };
    f(&ctx)
}

fn assert_valid(plan: &Plan) {
    let v = verify(plan);
    assert!(v.is_empty(), "{v:#?}");
    let r = check_numeric(
        plan,
        &NumericOptions {
            max_rows_per_doc: 128,
            ..NumericOptions::default()
        },
    )
    .unwrap();
    assert!(r.max_abs_error < 1e-9, "{r:?}");
}

#[test]
fn flashcp_ilp_equals_brute_force_on_a_small_batch() {
    let batch = Batch::new(0, vec![900, 500, 300, 200, 100]);
    with_ctx(2, 1000, |ctx| {
        for mode in [Mode::Objective, Mode::MinComm] {
            let opts = Options {
                granularity: 400,
                mode,
                lambda: 0.5,
                target_imbalance: 1.1,
                time_limit: 10.0,
                ..Options::default()
            };
            let inst = ilp::flashcp::instance(&batch, ctx, &opts).unwrap();
            assert!(
                inst.problem.items.len() <= 12,
                "{}",
                inst.problem.items.len()
            );
            let (_, brute) = search::brute_force(&inst.problem).expect("feasible");
            let r = ilp::flashcp::solve(&batch, ctx, &opts).unwrap();
            assert_eq!(r.ilp.status, Status::Optimal);
            assert!((r.ilp.objective.unwrap() - brute.objective).abs() < 1e-9);
            assert_valid(&r.plan);
        }
    });
}

#[test]
fn fcp_ilp_equals_brute_force_on_a_small_batch() {
    let batch = Batch::new(0, vec![3000, 1800, 700, 400, 100]);
    with_ctx(3, 2500, |ctx| {
        let f = Fcp {
            block: 512,
            ..Fcp::default()
        };
        let opts = Options {
            lambda: 0.0,
            ..Options::default()
        };
        let inst = ilp::fcp::instance(&f, &batch, ctx, &opts).unwrap();
        assert!(
            inst.problem.items.len() <= 12,
            "{}",
            inst.problem.items.len()
        );
        let (_, brute) = search::brute_force(&inst.problem).expect("feasible");
        let r = ilp::fcp::solve(&f, &batch, ctx, &opts).unwrap();
        assert_eq!(r.ilp.status, Status::Optimal);
        assert!((r.ilp.objective.unwrap() - brute.objective).abs() < 1e-9);
        assert_valid(&r.plan);
    });
}

/// Deterministic pseudo-Pile batches: a few long documents and many short ones.
fn batches(count: usize, tokens: u64) -> Vec<Batch> {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    (0..count)
        .map(|i| {
            let mut lens = Vec::new();
            let mut left = tokens;
            while left > 0 {
                let l = if rng.gen_bool(0.1) {
                    rng.gen_range(2000..8000)
                } else {
                    rng.gen_range(20..600)
                }
                .min(left);
                lens.push(l);
                left -= l;
            }
            Batch::new(i, lens)
        })
        .collect()
}

#[test]
fn ilp_is_never_worse_than_its_warm_start_and_plans_verify() {
    with_ctx(4, 4096, |ctx| {
        for b in batches(4, 16384) {
            for mode in [Mode::Objective, Mode::MinComm] {
                let opts = Options {
                    granularity: 512,
                    mode,
                    time_limit: 0.3,
                    ..Options::default()
                };
                let r = ilp::flashcp::solve(&b, ctx, &opts).unwrap();
                if let Some(h) = r.heuristic.objective {
                    assert!(r.ilp.objective.unwrap() <= h + 1e-12, "{:?}", r.ilp);
                }
                assert!(r.ilp.bound <= r.ilp.objective.unwrap_or(f64::INFINITY) + 1e-12);
                assert_valid(&r.plan);
            }
            let f = Fcp {
                block: 1024,
                ..Fcp::default()
            };
            let opts = Options {
                time_limit: 0.3,
                ..Options::default()
            };
            let ctx_roomy = PlanContext {
                tokens_per_rank: 5120,
                ..*ctx
            };
            let r = ilp::fcp::solve(&f, &b, &ctx_roomy, &opts).unwrap();
            if let Some(h) = r.heuristic.objective {
                assert!(r.ilp.objective.unwrap() <= h + 1e-12);
            }
            assert_valid(&r.plan);
        }
    });
}

#[test]
fn a_time_out_returns_the_incumbent_with_its_gap() {
    with_ctx(4, 32768, |ctx| {
        let b = &batches(1, 131072)[0];
        let opts = Options {
            granularity: 1024,
            time_limit: 0.0,
            ..Options::default()
        };
        let r = ilp::flashcp::solve(b, ctx, &opts).unwrap();
        let obj = r.ilp.objective.expect("the warm start is returned");
        assert!(obj <= r.heuristic.objective.unwrap() + 1e-12);
        if r.ilp.status == Status::TimedOut {
            let gap = r.ilp.gap.unwrap();
            assert!((0.0..1.0).contains(&gap));
            assert!((gap - (obj - r.ilp.bound) / obj).abs() < 1e-12);
        }
        assert_valid(&r.plan);
    });
}

/// Regression: with a cap so tight that LPT had to cut a unit, `fcp ilp --scheme fcp` used to
/// exit 2 when the search found no whole-unit assignment in time. It must return the best plan
/// known (the heuristic's) instead — never nothing.
#[test]
fn fcp_ilp_with_a_tight_cap_returns_the_heuristic_plan() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("pile.csv");
    let plan = dir.path().join("ilp.json");
    let fcp = || assert_cmd::Command::cargo_bin("fcp").unwrap();
    fcp()
        .args([
            "trace", "gen", "--source", "pile", "--docs", "3000", "--seed", "0", "-o",
        ])
        .arg(&trace)
        .assert()
        .success();
    fcp()
        .args(["ilp", "--scheme", "fcp", "--ranks", "4", "--pack", "window"])
        .args(["--context", "131072", "--time-limit", "1", "--trace"])
        .arg(&trace)
        .arg("-o")
        .arg(&plan)
        .assert()
        .success();
    fcp()
        .args(["verify", "--numeric"])
        .arg(&plan)
        .assert()
        .success();
}
