//! End-to-end: a training step around the layer (`--micro-batches`, `--dp-overlap`): the
//! pipeline's bubble and the data-parallel collectives once a step.

mod support;

use support::{fcp, json, plan_with_tp as plan, stdout_of, tpcp_16};

use predicates::prelude::*;
use serde_json::Value;

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// The step is the micro-batches' layers plus the bubble and what DP leaves exposed; the
/// throughput follows from it; rows rank by it.
#[test]
fn tpcp_prices_the_step_and_ranks_by_it() {
    let rows = json(fcp().args(tpcp_16("hybrid:quick=true")).args([
        "--json",
        "--pp",
        "4",
        "--micro-batches",
        "8",
    ]));
    let rows = rows.as_array().unwrap();
    let ran: Vec<&Value> = rows.iter().filter(|r| r["error"].is_null()).collect();
    assert!(ran.len() >= 2, "{rows:?}");
    for r in &ran {
        let s = &r["step"];
        let layer = f(r, "layer_time_ms");
        // Llama-3-70B's 80 layers over 4 stages; 8 + 3 slots, 3 of them the bubble.
        assert_eq!(s["stage_layers"], 20);
        assert_eq!(s["micro_batches"], 8);
        assert!(
            (f(s, "pipeline_ms") - 11.0 * 20.0 * layer).abs() < 1e-6,
            "{s}"
        );
        assert!((f(s, "bubble_ms") - 3.0 * 20.0 * layer).abs() < 1e-6, "{s}");
        // Without overlap every data-parallel collective is exposed.
        assert_eq!(f(s, "dp_exposed_ms"), f(s, "dp_comm_ms"));
        assert!(s.get("dp_overlap").is_none());
        assert!((f(s, "step_ms") - f(s, "pipeline_ms") - f(s, "dp_exposed_ms")).abs() < 1e-6);
        // 8 windows of real tokens over 16 GPUs × 4 stages.
        let tokens = f(s, "tokens_per_gpu_s") * f(s, "step_ms") * 1e-3 * 64.0 / 8.0;
        assert!(tokens > 30_000.0 && tokens <= 32_768.0, "{tokens}");
        // The CP ranks of one TP index hold the same weights: at CP above 1 they reduce.
        assert_eq!(
            f(s, "dp_comm_ms") > 0.0,
            r["cp"].as_u64().unwrap() > 1,
            "{r}"
        );
    }
    // The text names the step, and its answer is the fastest step, not the fastest layer.
    let text = stdout_of(fcp().args(tpcp_16("hybrid:quick=true")).args([
        "--pp",
        "4",
        "--micro-batches",
        "8",
    ]));
    assert!(text.contains("step of 8 micro-batches"), "{text}");
    assert!(
        text.contains("step_ms") && text.contains("tok/s/GPU"),
        "{text}"
    );
    let best = ran
        .iter()
        .filter(|r| r["footprint"]["fits"] != Value::Bool(false))
        .min_by(|a, b| f(&a["step"], "step_ms").total_cmp(&f(&b["step"], "step_ms")))
        .unwrap();
    let answer = format!(
        "at TP {} × CP {}, {:.1} ms a step",
        best["tp"],
        best["cp"],
        f(&best["step"], "step_ms")
    );
    assert!(text.contains(&answer), "{answer} in {text}");
}

/// Overlapping hides the reduction under the last backward pass: never more exposed, and
/// here less.
#[test]
fn dp_overlap_hides_what_the_first_and_last_micro_batch_can() {
    let step = |overlap: bool| {
        let mut cmd = fcp();
        cmd.args(tpcp_16("hybrid:quick=true")).args([
            "--json",
            "--micro-batches",
            "4",
            "--dp",
            "2",
        ]);
        if overlap {
            cmd.arg("--dp-overlap");
        }
        json(&mut cmd)
    };
    let (plain, over) = (step(false), step(true));
    let mut hid = false;
    for (a, b) in plain
        .as_array()
        .unwrap()
        .iter()
        .zip(over.as_array().unwrap())
    {
        if !a["error"].is_null() {
            continue;
        }
        let (a, b) = (&a["step"], &b["step"]);
        assert_eq!(b["dp_overlap"], Value::Bool(true));
        assert_eq!(f(a, "dp_comm_ms"), f(b, "dp_comm_ms"));
        assert!(f(b, "dp_exposed_ms") <= f(a, "dp_exposed_ms"));
        hid |= f(b, "dp_exposed_ms") < f(a, "dp_exposed_ms");
    }
    assert!(hid, "{over}");
}

#[test]
fn a_step_needs_a_training_setting_both_passes_and_enough_micro_batches() {
    let cases: [(&[&str], &str); 5] = [
        (&["--dp-overlap"], "it needs --micro-batches"),
        (
            &["--micro-batches", "2", "--pp", "4"],
            "fewer than the 4 pipeline stages",
        ),
        (
            &["--micro-batches", "4", "--pass", "fwd"],
            "runs both passes",
        ),
        (&["--micro-batches", "0"], "1 to 1048576 micro-batches"),
        (
            &["--micro-batches", "4", "--model", "llama3-8b", "--pp", "3"],
            "does not divide",
        ),
    ];
    for (args, says) in cases {
        fcp()
            .args(tpcp_16("hybrid:quick=true"))
            .args(args)
            .assert()
            .failure()
            .stdout("")
            .stderr(predicate::str::contains(says));
    }
}

/// ZeRO 3 runs its collectives layer by layer: a step adds no data-parallel traffic of its
/// own, and overlapping it says it changes nothing.
#[test]
fn zero_3_has_no_collectives_once_a_step() {
    let out = fcp()
        .args(tpcp_16("hybrid:quick=true"))
        .args([
            "--zero",
            "3",
            "--dp",
            "2",
            "--micro-batches",
            "2",
            "--dp-overlap",
            "--recompute",
            "full",
        ])
        .assert()
        .success()
        .stderr(predicate::str::contains("--dp-overlap changes nothing"))
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("ZeRO 3 runs them layer by layer"), "{text}");
}

#[test]
fn simulate_adds_the_step_of_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), "zigzag", 8);
    let r = json(
        fcp()
            .args([
                "simulate",
                "--json",
                "--layer",
                "--memory",
                "--micro-batches",
                "4",
                "--pp",
                "2",
            ])
            .arg(&p),
    );
    let s = &r["step"];
    let layer = f(&r, "layer_time_ms");
    assert!(
        (f(s, "pipeline_ms") - 5.0 * 40.0 * layer).abs() < 1e-6,
        "{s}"
    );
    let text = stdout_of(
        fcp()
            .args(["simulate", "--layer", "--memory", "--micro-batches", "4"])
            .arg(&p),
    );
    assert!(text.contains("training step:"), "{text}");
    // The step comes from the memory count's setting.
    fcp()
        .args(["simulate", "--layer", "--micro-batches", "4"])
        .arg(&p)
        .assert()
        .failure()
        .stderr(predicate::str::contains("--layer --memory"));
}

/// Regression (bug hunt): one micro-batch read "1 micro-batches" and "1 layers a stage",
/// and a tiny window's throughput "0 tokens/s".
#[test]
fn one_micro_batch_reads_in_the_singular_and_small_rates_keep_their_digits() {
    let text = stdout_of(fcp().args([
        "tpcp",
        "--gpus",
        "8",
        "--context",
        "8192",
        "--batches",
        "1",
        "--schemes",
        "zigzag",
        "--model",
        "llama3-8b",
        "--micro-batches",
        "1",
        "--pp",
        "1",
    ]));
    assert!(text.contains("a step of 1 micro-batch,"), "{text}");
    assert!(!text.contains("1 micro-batches"), "{text}");
    let tiny = stdout_of(fcp().args([
        "tpcp",
        "--gpus",
        "64",
        "--context",
        "1",
        "--batches",
        "1",
        "--schemes",
        "zigzag",
        "--micro-batches",
        "2",
    ]));
    let rate: f64 = tiny
        .split("micro-batches, ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rate in {tiny}"));
    assert!(rate > 0.0, "{tiny}");
}
