//! FCP's switches on `fcp plan` and `fcp ablation`, end to end.

mod support;

use std::path::{Path, PathBuf};
use support::fcp;

use predicates::prelude::*;

fn gen_trace(dir: &Path, source: &str) -> PathBuf {
    let out = dir.join(format!("{source}.csv"));
    fcp()
        .args([
            "trace", "gen", "--source", source, "--docs", "400", "--seed", "3", "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    out
}

fn plan_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn switches_become_scheme_params_and_plans_verify() {
    let dir = tempfile::tempdir().unwrap();
    let trace = gen_trace(dir.path(), "wlb-llm");
    let out = dir.path().join("p.json");
    fcp()
        .args([
            "plan",
            "--scheme",
            "fcp",
            "--ranks",
            "8",
            "--tokens-per-rank",
            "8192",
        ])
        .arg("--trace")
        .arg(&trace)
        .args(["--block", "2048", "--coalesce", "8"])
        .args([
            "--no-pipeline",
            "--no-solver",
            "--no-coalesce",
            "--no-reshuffle",
        ])
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let p = plan_json(&out);
    let params = &p["scheme"]["params"];
    assert_eq!(params["block"], 2048);
    assert_eq!(params["coalesce"], 8);
    for k in ["pipeline", "solver", "coalescer", "reshuffle"] {
        assert_eq!(params[k], false, "{k}");
    }
    assert!(p.get("input_layout").is_none());
    assert_eq!(p["congestion_free"], false);
    fcp()
        .args(["verify", "--numeric"])
        .arg(&out)
        .assert()
        .success();

    // Flags override the entry's own parameters; `--reshuffle` turns the reshuffler on.
    fcp()
        .args([
            "plan",
            "--scheme",
            "fcp:block=512,coalesce=2",
            "--ranks",
            "8",
        ])
        .args([
            "--tokens-per-rank",
            "8192",
            "--block",
            "1024",
            "--reshuffle",
        ])
        .arg("--trace")
        .arg(&trace)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let p = plan_json(&out);
    assert_eq!(p["scheme"]["params"]["block"], 1024);
    assert_eq!(p["scheme"]["params"]["coalesce"], 2);
    assert!(p["input_layout"].is_array());
    fcp()
        .args(["verify", "--numeric"])
        .arg(&out)
        .assert()
        .success();
}

#[test]
fn switches_are_refused_by_schemes_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = gen_trace(dir.path(), "lognormal");
    for flag in [
        "--no-pipeline",
        "--no-reshuffle",
        "--no-coalesce",
        "--no-solver",
    ] {
        fcp()
            .args(["plan", "--scheme", "ring", "--ranks", "4", flag])
            .arg("--trace")
            .arg(&trace)
            .args(["-o", "-"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(flag).and(predicate::str::contains("ring")));
    }
}

#[test]
fn ablation_prints_every_row_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let trace = gen_trace(dir.path(), "magi");
    let args = [
        "ablation",
        "--ranks",
        "8",
        "--tokens-per-rank",
        "16384",
        "--hardware",
        "h100",
        "--model",
        "llama3-70b",
        "--scheme",
        "fcp:block=2048",
    ];
    let out = fcp()
        .args(args)
        .arg("--trace")
        .arg(&trace)
        .arg("--json")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["row"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "base",
            "+pipelining",
            "+solver",
            "+coalescer",
            "+traffic repair",
            "+reshuffler"
        ]
    );
    for r in &rows {
        for k in ["mfu_fwd", "mfu_bwd"] {
            let x = r[k].as_f64().unwrap();
            assert!(x > 0.0 && x <= 1.0, "{r}");
        }
    }
    // Each row turns its switch on in the previous row's entry, an entry `plan` accepts.
    let first = rows[0]["scheme"].as_str().unwrap();
    assert_eq!(
        first,
        "fcp:block=2048,pipeline=false,solver=false,coalescer=false,repair=false,reshuffle=false"
    );
    let last = rows[5]["scheme"].as_str().unwrap();
    assert_eq!(
        last,
        "fcp:block=2048,pipeline=true,solver=true,coalescer=true,repair=true,reshuffle=true"
    );
    fcp()
        .args(args)
        .arg("--trace")
        .arg(&trace)
        .assert()
        .success()
        .stdout(predicate::str::contains("| +reshuffler |"));
    fcp()
        .args(["ablation", "--ranks", "4", "--scheme", "ring"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("fcp entry"));
}

/// Regression (bug hunt): `fcp ablation --scheme fcp:pipeline=maybe` exited 0, because every row
/// overwrote `pipeline` before the entry was parsed; `plan` refuses the same entry.
#[test]
fn ablation_refuses_a_bad_switch_value_its_rows_would_override() {
    for cmd in [&["plan", "-o", "-"][..], &["ablation"]] {
        fcp()
            .args(cmd)
            .args(["--ranks", "4", "--tokens-per-rank", "8192"])
            .args(["--scheme", "fcp:pipeline=maybe"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("`pipeline` must be true or false"));
    }
}
