//! End-to-end: `fcp demo`, the README's main command, and the advice it ends with.

mod support;

use support::fcp;

use predicates::prelude::*;

fn demo(args: &[&str]) -> String {
    let out = fcp()
        .arg("demo")
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

#[test]
fn demo_compares_every_scheme_and_recommends_the_fastest() {
    let out = demo(&[
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--batches",
        "2",
    ]);
    for scheme in fcp::planners::SCHEMES {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(scheme)),
            "no row for {scheme}:\n{out}"
        );
    }
    let use_line = out
        .lines()
        .find(|l| l.starts_with("All plans verified. Use "))
        .expect("a recommendation");
    // The recommended scheme has the smallest time_ms in the table.
    let best = use_line["All plans verified. Use ".len()..]
        .split(':')
        .next()
        .unwrap();
    let times: Vec<(String, f64)> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            let t: f64 = w.next()?.parse().ok()?;
            Some((name.to_string(), t))
        })
        .collect();
    let fastest = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(best, fastest.0, "{out}");
}

/// Regression: the `Next:` line dropped `--trace`, `--hardware` and `--model`, so following it
/// planned the bundled trace for an H100 instead of what the demo had just compared.
#[test]
fn the_next_line_replans_what_the_demo_recommended() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    fcp()
        .args([
            "trace", "gen", "--source", "wlb-llm", "--docs", "300", "--seed", "5", "-o",
        ])
        .arg(&trace)
        .assert()
        .success();
    let trace = trace.to_str().unwrap();
    let out = demo(&[
        "--trace",
        trace,
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--hardware",
        "b200",
        "--model",
        "llama3-8b",
        "--batches",
        "1",
    ]);
    let use_line = out
        .lines()
        .find(|l| l.starts_with("All plans verified. Use "))
        .unwrap();
    let ms: f64 = use_line
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(" ms").next())
        .and_then(|x| x.parse().ok())
        .unwrap();
    let next = out.lines().find(|l| l.starts_with("Next: ")).unwrap();
    let plan_cmd = next.split('`').nth(1).unwrap();
    let simulate_cmd = next.split('`').nth(3).unwrap();
    assert!(plan_cmd.contains(&format!("--trace {trace}")), "{next}");
    assert!(
        plan_cmd.contains("--hardware b200 --model llama3-8b"),
        "{next}"
    );
    // Run the advice as written (in the temporary folder) and get the demo's figure back.
    let words = |cmd: &str| -> Vec<String> {
        cmd.split_whitespace()
            .skip(1)
            .map(|w| {
                if w == "plan.json" {
                    dir.path().join("plan.json").display().to_string()
                } else {
                    w.to_string()
                }
            })
            .collect()
    };
    fcp().args(words(plan_cmd)).assert().success();
    let sim = fcp()
        .args(words(simulate_cmd))
        .arg("--json")
        .assert()
        .success()
        .stderr(predicate::str::is_empty())
        .get_output()
        .stdout
        .clone();
    let sim: serde_json::Value = serde_json::from_slice(&sim).unwrap();
    let got = sim["attention_time_ms"].as_f64().unwrap();
    assert!(
        (got - ms).abs() < 0.0005 + 1e-9,
        "demo said {ms} ms, the plan simulates {got} ms"
    );
}
