//! Issue 7: the exact search equals brute force on small instances (and microlp's MILP agrees),
//! never loses to its warm start, returns its incumbent with a gap on a time-out, and its
//! plans verify numerically.

mod support;

use fcp::hardware::Hardware;
use fcp::ilp::search::{self, Item, Problem};
use fcp::ilp::{self, milp, Mode, Options, Status};
use fcp::plan::{check_numeric, verify, Mask, NumericOptions, Plan, TransferTensor};
use fcp::planners::{Fcp, PlanContext, Planner};
use fcp::{Batch, Model};
use predicates::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::fcp;

/// A random problem of `m` items: single-segment pieces of a few documents (`chain`), or
/// multi-segment units.
fn random_problem(rng: &mut ChaCha8Rng, m: usize, n: u32, chain: bool, lambda: f64) -> Problem {
    let items = random_items(rng, m, 0.35, |rng, k, doc, pos| {
        let len = rng.gen_range(1..=8u64);
        let mut segs = vec![(doc, pos, len)];
        if !chain && rng.gen_bool(0.3) {
            segs.push((1000 + k as u32, 0, 2));
        }
        // Causal work of the document's piece.
        (segs, (len * (2 * pos + len + 1) / 2) as f64)
    });
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

/// `m` items, each piece of a document (a new one with probability `new_doc`) made by
/// `piece(rng, k, doc, pos)` as its segments and work; its tokens are its segments'.
fn random_items(
    rng: &mut ChaCha8Rng,
    m: usize,
    new_doc: f64,
    mut piece: impl FnMut(&mut ChaCha8Rng, usize, u32, u64) -> (Vec<(u32, u64, u64)>, f64),
) -> Vec<Item> {
    let (mut doc, mut pos) = (0u32, 0u64);
    (0..m)
        .map(|k| {
            if rng.gen_bool(new_doc) {
                doc += 1;
                pos = 0;
            }
            let (segs, work) = piece(rng, k, doc, pos);
            pos += segs[0].2;
            Item {
                tokens: segs.iter().map(|s| s.2).sum(),
                work,
                segs,
            }
        })
        .collect()
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

/// Regression (bug hunt): without `chain` the search took two ranks of equal load and tokens
/// for alike although they held blocks of different documents, pruned the branch that keeps a
/// document's blocks together, and proved a worse assignment optimal. Items of equal weight
/// (FCP's full blocks) make such ties common; brute force is the oracle.
#[test]
fn regression_search_took_ranks_holding_different_documents_for_alike() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..80 {
        let n = 2 + (case % 2) as u32;
        let m = rng.gen_range(4..=if n == 3 { 7 } else { 9 });
        let items = random_items(&mut rng, m, 0.5, |rng, _, doc, pos| {
            let len = [4u64, 8][rng.gen_range(0..2)];
            (vec![(doc, pos, len)], len as f64)
        });
        let total: u64 = items.iter().map(|i| i.tokens).sum();
        let p = Problem {
            items,
            ranks: n,
            lo: 0,
            hi: total,
            alpha: 1.0,
            lambda: [0.1, 1.0][case % 2],
            comm_ref: (total / u64::from(n)) as f64,
            load_cap: None,
            chain: false,
            forced_exchange: Vec::new(),
        };
        let (_, brute) = search::brute_force(&p).expect("every assignment fits");
        let o = search::solve(&p, None, 10.0);
        assert!(
            (o.value.objective - brute.objective).abs() < 1e-9,
            "case {case}: search {} ({:?}) vs brute force {}",
            o.value.objective,
            o.status,
            brute.objective
        );
    }
}

/// The bug hunt's batch: `fcp ilp --scheme fcp` proved 1.1387 optimal where microlp found
/// 1.1298 (an assignment with no exchange at all); both solvers now agree.
#[test]
fn regression_fcp_ilp_search_agrees_with_microlp_on_equal_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "doc_len\n1\n2\n3\n64\n65\n127\n128\n129\n").unwrap();
    let objective = |extra: &[&str]| -> f64 {
        let out = fcp()
            .args(["ilp", "--scheme", "fcp", "--trace"])
            .arg(&trace)
            .args([
                "--ranks",
                "2",
                "--tokens-per-rank",
                "300",
                "--block",
                "128",
                "--json",
            ])
            .args(extra)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        v["ilp"]["objective"]
            .as_f64()
            .unwrap_or_else(|| panic!("no objective in {v}"))
    };
    let (search, milp) = (objective(&[]), objective(&["--microlp"]));
    assert!(
        (search - milp).abs() < 1e-6,
        "search {search} vs microlp {milp}"
    );
    assert!((search - 1.1298).abs() < 1e-4, "{search}");
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
        judge: fcp::planners::Judge::default(),
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

/// A batch whose tight cap (2 × 3000 tokens for 6000) makes LPT cut a 1024-token unit.
fn cut_batch() -> Batch {
    Batch::new(0, vec![3000, 1800, 700, 400, 100])
}

fn fcp_1024() -> Fcp {
    Fcp {
        block: 1024,
        ..Fcp::default()
    }
}

/// Regression (bug hunt): when LPT had to cut a unit, the heuristic column showed the ILP's own
/// numbers, hiding that the heuristic's plan beat the "optimal" whole-unit ILP. The column
/// must describe the heuristic's real plan, and a note must say the optimum is over
/// whole-unit assignments only.
#[test]
fn fcp_ilp_heuristic_column_is_the_real_plan_when_lpt_cut_a_unit() {
    let batch = cut_batch();
    with_ctx(2, 3000, |ctx| {
        let f = fcp_1024();
        let opts = Options::default();
        let inst = ilp::fcp::instance(&f, &batch, ctx, &opts).unwrap();
        assert!(inst.warm.is_none() && inst.cut_units() > 0);
        let r = ilp::fcp::solve(&f, &batch, ctx, &opts).unwrap();
        // Imbalance: LPT's own per-rank f-loads.
        let loads = &inst.heuristic.loads;
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        let lpt_imbalance = loads.iter().copied().fold(0.0, f64::max) / mean;
        assert!(
            (r.heuristic.imbalance - lpt_imbalance).abs() < 1e-12,
            "{r:?}"
        );
        // Comm: the most K/V tokens one rank sends in the heuristic's plan itself.
        let plan = f.plan(&batch, ctx).unwrap();
        let mut sent = vec![0u64; 2];
        for t in plan
            .transfers
            .iter()
            .filter(|t| t.tensor == TransferTensor::Kv)
        {
            sent[t.src as usize] += t.tokens();
        }
        assert_eq!(r.heuristic.comm_tokens, sent.into_iter().max().unwrap());
        // Here the heuristic beats the whole-unit optimum, and the report says why.
        let (h, i) = (r.heuristic.objective.unwrap(), r.ilp.objective.unwrap());
        assert_eq!(r.ilp.status, Status::Optimal);
        assert!(h < i, "heuristic {h} vs ilp {i}");
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("over whole-unit assignments") && n.contains("is better")),
            "{:?}",
            r.notes
        );
        assert_valid(&r.plan);
    });
}

/// The heuristic is measured on LPT's placement in every branch; when every unit went whole,
/// that is exactly the warm start's value in the ILP's problem.
#[test]
fn fcp_ilp_heuristic_side_equals_the_warm_start_when_lpt_placed_units_whole() {
    let batch = Batch::new(0, vec![3000, 1800, 700, 400, 100]);
    with_ctx(3, 2500, |ctx| {
        let f = Fcp {
            block: 512,
            ..Fcp::default()
        };
        let inst = ilp::fcp::instance(&f, &batch, ctx, &Options::default()).unwrap();
        let warm = inst.warm.as_deref().expect("LPT placed every unit whole");
        let v = inst.problem.evaluate(warm);
        let h = ilp::fcp::heuristic_side(&inst.problem, &inst.heuristic);
        assert!((h.imbalance - v.imbalance).abs() < 1e-12);
        assert_eq!(h.comm_tokens, v.comm_tokens);
        assert!((h.objective.unwrap() - v.objective).abs() < 1e-12);
    });
}

/// Regression (bug hunt): an unreachable min-comm target read `optimal` with no objective and an
/// infinite bound, the note blamed the token cap and a time limit that never struck, and the
/// heuristic's numbers changed with R although its plan did not.
#[test]
fn fcp_ilp_unreachable_target_is_infeasible_and_the_note_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("small.csv");
    std::fs::write(
        &trace,
        "doc_len\n3000\n1500\n700\n400\n2000\n592\n5000\n3192\n",
    )
    .unwrap();
    let run = |r: &str| -> serde_json::Value {
        let out = fcp()
            .args([
                "ilp",
                "--scheme",
                "fcp",
                "--ranks",
                "3",
                "--tokens-per-rank",
                "3000",
            ])
            .args(["--block", "1024", "--mode", "min-comm", "--time-limit", "2"])
            .args(["--json", "--target-imbalance", r, "--trace"])
            .arg(&trace)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        serde_json::from_slice(&out).unwrap()
    };
    let (unreachable, reachable) = (run("1.0"), run("1.1"));
    assert_eq!(unreachable["ilp"]["status"], "infeasible");
    assert!(unreachable["ilp"]["objective"].is_null());
    let note = unreachable["notes"][0].as_str().unwrap();
    assert!(note.contains("imbalance ≤ R = 1"), "{note}");
    assert!(
        !note.contains("token cap") && !note.contains("time limit"),
        "{note}"
    );
    assert_eq!(reachable["ilp"]["status"], "optimal");
    assert_eq!(
        unreachable["heuristic"]["imbalance"],
        reachable["heuristic"]["imbalance"]
    );
    assert_eq!(
        unreachable["heuristic"]["comm_saving"],
        reachable["heuristic"]["comm_saving"]
    );
}

/// Bug 3, the other paths: the search and microlp say `infeasible` when nothing meets the
/// constraints (FlashCP's pieces under an unreachable R; FCP's whole units under a cap that
/// forces a cut), and the note names the token cap only when it is the obstacle.
#[test]
fn ilp_with_nothing_feasible_is_infeasible_for_both_schemes_and_solvers() {
    // One 1000-token document on 3 ranks: no cut into 333–334-token shards balances it.
    let batch = Batch::new(0, vec![1000]);
    with_ctx(3, 334, |ctx| {
        for microlp in [false, true] {
            let opts = Options {
                granularity: 1000,
                mode: Mode::MinComm,
                target_imbalance: 1.0,
                microlp,
                ..Options::default()
            };
            let inst = ilp::flashcp::instance(&batch, ctx, &opts).unwrap();
            assert!(search::brute_force(&inst.problem).is_none());
            let r = ilp::flashcp::solve(&batch, ctx, &opts).unwrap();
            assert_eq!(r.ilp.status, Status::Infeasible, "microlp {microlp}");
            assert!(r.ilp.objective.is_none() && r.ilp.bound.is_infinite());
            assert!(r.notes[0].contains("imbalance ≤ R"), "{:?}", r.notes);
            assert_valid(&r.plan);
        }
    });
    let batch = cut_batch();
    with_ctx(3, 2000, |ctx| {
        for microlp in [false, true] {
            let opts = Options {
                microlp,
                ..Options::default()
            };
            let r = ilp::fcp::solve(&fcp_1024(), &batch, ctx, &opts).unwrap();
            assert_eq!(r.ilp.status, Status::Infeasible, "microlp {microlp}");
            let note = r.notes.last().unwrap();
            assert!(
                note.contains("token cap") && !note.contains("time limit"),
                "{note}"
            );
            assert_valid(&r.plan);
            // Regression (bug hunt): the plan carried the last note alone, as a bare string,
            // and FCP plans named FlashCP's granularity.
            let recorded = &r.plan.scheme.params["ilp"];
            assert_eq!(recorded["status"], "infeasible", "{recorded}");
            assert_eq!(recorded["notes"].as_array().unwrap().len(), r.notes.len());
            assert!(recorded.get("granularity").is_none(), "{recorded}");
        }
    });
}

/// Regression (bug hunt): `fcp ilp -o -` wrote a file named `-`; it writes the plan to stdout,
/// as `fcp plan -o -` does, and the report to stderr.
#[test]
fn regression_ilp_writes_its_plan_to_stdout_with_dash() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "doc_len\n3000\n1500\n700\n600\n").unwrap();
    let run = |extra: &[&str]| {
        fcp()
            .current_dir(dir.path())
            .args([
                "ilp", "--scheme", "flashcp", "--trace", "t.csv", "--ranks", "2",
            ])
            .args(["--pack", "window", "--context", "8192", "-o", "-"])
            .args(extra)
            .assert()
    };
    let out = run(&[]).success();
    let o = out.get_output();
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(plan["scheme"]["name"], "flashcp");
    assert!(plan["scheme"]["params"]["ilp"]["granularity"].is_number());
    assert!(String::from_utf8_lossy(&o.stderr).contains("heuristic"));
    assert!(!dir.path().join("-").exists());
    run(&["--json"])
        .code(2)
        .stderr(predicates::str::contains("write the plan to a file"));
}

/// Regression (bug hunt): `--microlp` was silently ignored when LPT cut a unit (the branch and
/// bound ran instead). microlp visits no search nodes.
#[test]
fn fcp_ilp_microlp_is_honoured_when_lpt_cut_a_unit() {
    let batch = cut_batch();
    with_ctx(2, 3000, |ctx| {
        let run = |microlp| {
            let opts = Options {
                microlp,
                ..Options::default()
            };
            ilp::fcp::solve(&fcp_1024(), &batch, ctx, &opts).unwrap()
        };
        let (bb, lp) = (run(false), run(true));
        assert!(bb.ilp.nodes > 0);
        assert_eq!(lp.ilp.nodes, 0, "microlp ran");
        assert_eq!(lp.ilp.status, Status::Optimal);
        assert!((lp.ilp.objective.unwrap() - bb.ilp.objective.unwrap()).abs() < 1e-6);
    });
}

/// Regression (bug hunt): `--microlp --time-limit inf` (or 1e20) panicked converting the limit to
/// a `Duration` (exit 101). A limit too large to hold means no limit, for both solvers.
#[test]
fn ilp_time_limit_too_large_for_a_duration_means_no_limit() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "doc_len\n900\n500\n300\n200\n100\n").unwrap();
    // 1e19 s fits a `Duration` but overflowed microlp's deadline (`Instant + limit`).
    for limit in ["inf", "1e20", "1e19"] {
        for solver in [&["--microlp"][..], &[]] {
            fcp()
                .args([
                    "ilp",
                    "--scheme",
                    "flashcp",
                    "--ranks",
                    "2",
                    "--granularity",
                    "400",
                ])
                .args(["--time-limit", limit])
                .args(solver)
                .arg("--trace")
                .arg(&trace)
                .assert()
                .success()
                .stdout(predicate::str::contains("optimal"));
        }
    }
}

/// Regression (bug hunt): `--microlp --lambda 1e308` panicked inside microlp's pivoting. A
/// weight past a million is refused, naming the mode that minimises communication alone.
#[test]
fn an_absurd_lambda_is_refused_before_any_solver_runs() {
    fcp()
        .args(["ilp", "--scheme", "flashcp", "--ranks", "2", "--microlp"])
        .args(["--lambda", "1e308"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--mode min-comm"));
}

/// Regression (bug hunt): with N not dividing C the comm term was over ⌊C/N⌋ while a rank holds
/// up to ⌈C/N⌉ tokens, so a valid plan could read a negative saving. The reference is now the
/// most tokens a rank may hold, so no feasible assignment exceeds it.
#[test]
fn comm_saving_is_never_negative_when_ranks_do_not_divide_the_batch() {
    // The bug report's batch: 16384 tokens on 7 ranks, Algorithm 1 exchanges all of a
    // rank's ⌈C/N⌉ = 2341 tokens, one more than ⌊C/N⌋.
    let batch = Batch::new(0, vec![3000, 1500, 700, 400, 2000, 592, 5000, 3192]);
    with_ctx(7, 2341, |ctx| {
        let opts = Options {
            time_limit: 0.2,
            ..Options::default()
        };
        let inst = ilp::flashcp::instance(&batch, ctx, &opts).unwrap();
        let p = &inst.problem;
        assert_eq!(p.comm_ref, p.hi as f64);
        let r = ilp::flashcp::solve(&batch, ctx, &opts).unwrap();
        assert!(r.heuristic.comm_tokens > p.lo, "not the reported case");
        assert!(r.heuristic.comm_saving >= 0.0, "{:?}", r.heuristic);
        assert!(r.ilp.comm_saving >= 0.0, "{:?}", r.ilp);
    });
}

/// Regression (bug hunt): `--granularity` with `--scheme fcp` and `--block` with `--scheme
/// flashcp` were silently ignored (`--granularity 0` even ran); each is refused, naming the
/// scheme it applies to. The text header spells the mode as the flag does.
#[test]
fn an_option_of_the_other_scheme_is_refused_and_the_mode_is_spelt_as_its_flag() {
    fcp()
        .args(["ilp", "--scheme", "fcp", "--ranks", "2"])
        .args(["--granularity", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--granularity applies to"));
    fcp()
        .args(["ilp", "--scheme", "flashcp", "--ranks", "2", "--block", "7"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--block applies to --scheme fcp"));
    fcp()
        .args(["ilp", "--scheme", "flashcp", "--ranks", "2"])
        .args(["--tokens-per-rank", "2048"])
        .args(["--mode", "min-comm", "--time-limit", "1"])
        .assert()
        .success()
        .stdout(predicate::str::contains("mode min-comm ·"));
}

/// Regression (bug hunt): `--microlp` built its model before its time limit started, so a
/// 1 s limit at 128 ranks ran 3.5 s and 2.6 GB, and 256 ranks aborted out of memory with a
/// backtrace. A model past a million variables is refused up front (exit 2, at once, with
/// nothing on stdout); the branch and bound on the same batch keeps to the limit.
#[test]
fn regression_microlp_refuses_a_model_too_large_to_build() {
    let args = [
        "ilp",
        "--scheme",
        "flashcp",
        "--ranks",
        "96",
        "--time-limit",
        "1",
    ];
    fcp()
        .args(args)
        .arg("--microlp")
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicates::str::contains(
            "more than the 1000000 microlp is given",
        ));
    fcp().args(args).assert().success();
}
