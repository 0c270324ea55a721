//! Determinism (issue 11): plans, simulations, comparisons, sweeps and plots are byte-identical
//! across runs and whatever the rayon thread count. Each command runs twice, once on one
//! thread and once on three, and every output is compared byte for byte.

mod support;

use std::path::Path;
use support::fcp;

const SWEEP: &str = r#"
name = "determinism"
batches = 2
[grid]
traces = ["default", "gen:wlb-llm:seed=5"]
schemes = ["zigzag", "fcp", "flashcp", "magi"]
ranks = [4, 8]
tokens_per_rank = [8192]
"#;

/// Run every writing command into `dir` with `RAYON_NUM_THREADS=threads`; return
/// (name, bytes) of every output, files and stdout alike.
fn outputs(dir: &Path, threads: &str) -> Vec<(String, Vec<u8>)> {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &[&str]| -> Vec<u8> {
        let mut cmd = fcp();
        cmd.current_dir(dir).env("RAYON_NUM_THREADS", threads);
        cmd.args(args)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone()
    };
    let mut out = Vec::new();
    let mut stdout = |name: &str, bytes: Vec<u8>| out.push((name.to_string(), bytes));
    std::fs::write(dir.join("sweep.toml"), SWEEP).unwrap();
    let plan = [
        "plan",
        "--ranks",
        "8",
        "--tokens-per-rank",
        "8192",
        "--batch",
        "1",
    ];
    for scheme in ["fcp", "flashcp", "zigzag", "wlb-llm"] {
        let file = format!("{scheme}.json");
        run(&[&plan[..], &["--scheme", scheme, "-o", &file]].concat());
        stdout(
            &format!("simulate {scheme}"),
            run(&["simulate", &file, "--json"]),
        );
    }
    stdout(
        "compare",
        run(&[
            "compare",
            "--ranks",
            "8",
            "--tokens-per-rank",
            "8192",
            "--schemes",
            "all",
            "--batches",
            "2",
            "--csv",
        ]),
    );
    run(&["sweep", "sweep.toml", "-o", "sweep", "--quiet"]);
    run(&[
        "trace", "gen", "--source", "pile", "--docs", "500", "-o", "t.csv",
    ]);
    for ext in ["png", "svg"] {
        run(&["plot", "gantt", "fcp.json", "-o", &format!("gantt.{ext}")]);
        run(&[
            "plot",
            "imbalance",
            "sweep/results.json",
            "-o",
            &format!("imbalance.{ext}"),
        ]);
        run(&["plot", "cdf", "t.csv", "-o", &format!("cdf.{ext}")]);
    }
    let mut files = Vec::new();
    collect(dir, dir, &mut files);
    out.extend(files);
    out
}

/// Every file under `root`, by path relative to it, sorted.
fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            collect(root, &p, out);
        } else {
            let name = p.strip_prefix(root).unwrap().display().to_string();
            out.push((name, std::fs::read(&p).unwrap()));
        }
    }
}

#[test]
fn every_output_is_identical_across_runs_and_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let a = outputs(&dir.path().join("one"), "1");
    let b = outputs(&dir.path().join("three"), "3");
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(!x.is_empty(), "{name} is empty");
        assert!(x == y, "{name} differs between 1 and 3 threads");
    }
    // The outputs we meant to compare are all there: 4 plans, their simulations, compare,
    // the sweep's cells and results, a trace and 6 plots.
    let n = names(&a);
    for want in [
        "fcp.json",
        "simulate fcp",
        "compare",
        "sweep/results.csv",
        "sweep/results.json",
        "gantt.png",
        "gantt.svg",
        "imbalance.png",
        "cdf.svg",
    ] {
        assert!(n.iter().any(|x| x == want), "{want} missing from {n:?}");
    }
    assert!(n.iter().filter(|x| x.starts_with("sweep/cells/")).count() >= 16);
}
