//! End-to-end: `fcp validate` on a synthetic measured.json (no PyTorch needed), against the
//! numbers `fcp simulate --json` prints for the same plan.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::fcp;

/// `fcp validate --plan PLAN --measured MEASURED`, for more arguments and the assertion.
fn validate(plan: &Path, measured: &Path) -> assert_cmd::Command {
    let mut c = fcp();
    c.args(["validate", "--plan"])
        .arg(plan)
        .arg("--measured")
        .arg(measured);
    c
}
fn plan(dir: &Path) -> PathBuf {
    let out = dir.join("zigzag.json");
    fcp()
        .args(["plan", "--scheme", "zigzag", "--ranks", "4"])
        .args(["--tokens-per-rank", "4096", "-o"])
        .arg(&out)
        .assert()
        .success();
    out
}

fn simulate(plan: &Path, pass: &str) -> Value {
    let out = fcp()
        .arg("simulate")
        .arg(plan)
        .args(["--pass", pass, "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap()
}

/// A measurement in which every rank's compute is `factor` × the simulated compute, spread
/// evenly over its steps (as a replay would write it).
fn synthetic(plan_path: &Path, sim: &Value, factor: f64, pass: &str) -> Value {
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(plan_path).unwrap()).unwrap();
    let names: Vec<&str> = if pass == "both" {
        vec!["fwd", "bwd"]
    } else {
        vec![pass]
    };
    let ranks: Vec<Value> = plan["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let compute = factor * sim["ranks"][r]["compute_ms"].as_f64().unwrap();
            let steps = rp["steps"].as_array().unwrap().len();
            let per_pass = compute / names.len() as f64;
            // Every rank ends each pass at the same time, so the end-to-end time (the passes'
            // slowest ends summed) is the attention time given below.
            let attention = factor * sim["attention_time_ms"].as_f64().unwrap();
            let end = attention / names.len() as f64;
            let passes: Vec<Value> = names
                .iter()
                .map(|n| {
                    json!({"pass": n, "compute_ms": per_pass, "comm_ms": 1.0, "end_ms": end,
                        "steps": (0..steps).map(|s| json!({"step": s,
                            "compute_ms": per_pass / steps as f64, "wait_ms": 0.0})).collect::<Vec<_>>()})
                })
                .collect();
            // A rank's totals are its passes' sums, as a replay writes them.
            let k = names.len() as f64;
            json!({"rank": r, "compute_ms": compute, "comm_ms": k, "end_ms": attention, "passes": passes})
        })
        .collect();
    json!({"format": "fcp-measured", "version": 1, "mode": "distributed", "pass": pass,
        "time_unit": "ms", "device": "synthetic", "backend": "none", "dtype": "bfloat16",
        "attention_time_ms": factor * sim["attention_time_ms"].as_f64().unwrap(),
        "ranks": ranks})
}

#[test]
fn validate_reports_the_error_of_a_known_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path());
    for pass in ["fwd", "both"] {
        let sim = simulate(&p, pass);
        let m = dir.path().join(format!("measured-{pass}.json"));
        std::fs::write(&m, synthetic(&p, &sim, 2.0, pass).to_string()).unwrap();
        let out = validate(&p, &m)
            .arg("--json")
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let v: Value = serde_json::from_slice(&out).unwrap();
        // Measured = 2 × simulated: every per-rank and end-to-end error is 50%.
        let rc = &v["summary"]["rank_compute"];
        assert!((rc["mean"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{v}");
        assert_eq!(rc["n"], 4);
        let at = &v["summary"]["attention_time"];
        assert!(
            (at["rel_error"].as_f64().unwrap() - 0.5).abs() < 1e-9,
            "{v}"
        );
        let steps = v["steps"].as_array().unwrap();
        let per_rank: usize = 4 * if pass == "both" { 2 } else { 1 };
        assert_eq!(steps.len(), per_rank * 4, "4 steps per rank and pass");
        // The table form prints the same summary.
        validate(&p, &m)
            .assert()
            .success()
            .stdout(predicates::str::contains("compute per rank: mean 50.0%"));
        // A gate on the mean compute error.
        validate(&p, &m)
            .args(["--max-compute-error", "0.1"])
            .assert()
            .code(1);
    }
}

/// `--max-compute-error` passed (exit 0) a measurement whose compute times were all 0: the
/// report says "not measured", and a gate that cannot check now fails.
#[test]
fn the_compute_gate_fails_when_nothing_was_measured() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path());
    let sim = simulate(&p, "both");
    let gate = |m: &Path| {
        validate(&p, m)
            .args(["--max-compute-error", "0.1"])
            .assert()
    };
    let exact = dir.path().join("exact.json");
    std::fs::write(&exact, synthetic(&p, &sim, 1.0, "both").to_string()).unwrap();
    gate(&exact).success();
    let zero = dir.path().join("zero.json");
    std::fs::write(&zero, synthetic(&p, &sim, 0.0, "both").to_string()).unwrap();
    gate(&zero)
        .code(1)
        .stdout(predicates::str::contains("compute per rank: not measured"))
        .stderr(predicates::str::contains(
            "measures no compute time, so --max-compute-error cannot be checked",
        ));
}

/// One rank measured at 0 ms (its timing broke, or it recorded nothing) had no relative error,
/// was left out of the mean, and `--max-compute-error` passed on the other ranks.
#[test]
fn regression_a_rank_measured_at_zero_passed_the_compute_gate() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path());
    let sim = simulate(&p, "both");
    let mut m = synthetic(&p, &sim, 1.0, "both");
    let rank = &mut m["ranks"][2];
    rank["compute_ms"] = json!(0.0);
    for pass in rank["passes"].as_array_mut().unwrap() {
        pass["compute_ms"] = json!(0.0);
        for step in pass["steps"].as_array_mut().unwrap() {
            step["compute_ms"] = json!(0.0);
        }
    }
    let path = dir.path().join("one-zero.json");
    std::fs::write(&path, m.to_string()).unwrap();
    validate(&p, &path)
        .args(["--max-compute-error", "0.1"])
        .assert()
        .code(1)
        .stdout(predicates::str::contains(
            "(3 values, 1 measured 0 ms where simulated > 0)",
        ))
        .stderr(predicates::str::contains("measures 0 ms on 1 rank(s)"));
}

#[test]
fn bad_measurements_exit_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path());
    let sim = simulate(&p, "fwd");
    let good = synthetic(&p, &sim, 1.0, "fwd");
    let cases: Vec<(Value, &str)> = vec![
        (
            {
                let mut m = good.clone();
                m["format"] = json!("x");
                m
            },
            "format is",
        ),
        (
            {
                let mut m = good.clone();
                m["time_unit"] = json!("us");
                m
            },
            "time_unit",
        ),
        (
            {
                let mut m = good.clone();
                m["ranks"].as_array_mut().unwrap().pop();
                m
            },
            "the plan has 4",
        ),
        (
            {
                let mut m = good.clone();
                m["pass"] = json!("bwd");
                m
            },
            "has passes",
        ),
        (
            {
                let mut m = good.clone();
                m["ranks"][0]["compute_ms"] = json!(-3.0);
                m
            },
            "expected a time",
        ),
    ];
    for (m, msg) in cases {
        let f = dir.path().join("bad.json");
        std::fs::write(&f, m.to_string()).unwrap();
        validate(&p, &f)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(msg));
    }
    let f = dir.path().join("not-json.json");
    std::fs::write(&f, "nope").unwrap();
    validate(&p, &f)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("not a measured.json"));
    validate(&p, &dir.path().join("missing.json"))
        .assert()
        .code(2);
}

/// A plan made under `--tp` validates against one GPU's share of the model, and the report
/// says so (bug hunt: its header and JSON did not, so a TP run read as a TP 1 one).
#[test]
fn validating_a_plan_made_under_tp_names_the_split() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tp.json");
    fcp()
        .args(["plan", "--scheme", "zigzag", "--ranks", "4", "--tp", "2"])
        .args(["--tokens-per-rank", "4096", "-o"])
        .arg(&p)
        .assert()
        .success();
    let sim = simulate(&p, "fwd");
    let m = dir.path().join("m.json");
    std::fs::write(&m, synthetic(&p, &sim, 1.0, "fwd").to_string()).unwrap();
    let run = |json: bool| {
        let mut c = validate(&p, &m);
        if json {
            c.arg("--json");
        }
        String::from_utf8(c.assert().success().get_output().stdout.clone()).unwrap()
    };
    assert!(run(false)
        .lines()
        .next()
        .unwrap()
        .contains("llama3-70b · TP 2 · pass fwd"));
    let v: Value = serde_json::from_str(&run(true)).unwrap();
    assert_eq!(v["tp"], 2);
}

/// A replay that fell back to the dense sdpa op (one launch per piece) is compared, with a
/// warning that its compute reads high; the varlen backend's is not warned about.
#[test]
fn a_measurement_with_one_launch_per_piece_is_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path());
    let sim = simulate(&p, "both");
    for (backend, warned) in [("sdpa", true), ("sdpa-varlen", false)] {
        let mut m = synthetic(&p, &sim, 1.0, "both");
        m["backend"] = json!(backend);
        let path = dir.path().join(format!("{backend}.json"));
        std::fs::write(&path, m.to_string()).unwrap();
        let out = validate(&p, &path).assert().success().get_output().clone();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(
            err.contains("one launch per piece"),
            warned,
            "{backend}: {err}"
        );
    }
}
