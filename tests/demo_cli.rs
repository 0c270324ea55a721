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
    // The recommended scheme has the smallest whole-layer time in the table (the bundled
    // model and hardware give the layer's cost): `layer_ms`, fifth word from the end of a
    // row (then `layer_x`, `tok_im` and the two words of `act/layer`, such as `1.37 GiB`).
    let best = recommended(&out);
    let times = column(&out, |w| w.len().checked_sub(5));
    assert_eq!(times.len(), fcp::planners::SCHEMES.len(), "{out}");
    let fastest = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(best, fastest.0, "{out}");
    let layer_line = out
        .lines()
        .find(|l| l.starts_with("With the projections and MLP: "))
        .expect("the whole layer's figure");
    assert!(
        layer_line.contains(&format!("{:.3} ms per layer", fastest.1)),
        "{out}"
    );
}

/// Without the layer's widths (`mha-16` gives none) the demo compares attention alone and
/// recommends the scheme with the smallest `time_ms`.
#[test]
fn without_the_layers_widths_the_demo_recommends_on_attention() {
    let out = demo(&[
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--batches",
        "1",
        "--model",
        "mha-16",
    ]);
    assert!(!out.contains("layer_ms"), "{out}");
    assert!(!out.contains("With the projections"), "{out}");
    // `time_ms`, the first figure of a row.
    let best = recommended(&out);
    let times = column(&out, |_| Some(1));
    let fastest = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(best, fastest.0, "{out}");
    assert!(!out.contains("--layer"), "{out}");
}

/// The scheme the demo's verdict recommends.
fn recommended(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with("All plans verified. Use "))
        .expect("a recommendation");
    line["All plans verified. Use ".len()..]
        .split(':')
        .next()
        .unwrap()
        .to_string()
}

/// Per table row (a scheme name, then figures): the name and the figure at the index `at`
/// picks among the row's words.
fn column(out: &str, at: impl Fn(&[&str]) -> Option<usize>) -> Vec<(String, f64)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.get(1)?.parse::<f64>().ok()?;
            let t: f64 = w.get(at(&w)?)?.parse().ok()?;
            Some((w[0].to_string(), t))
        })
        .collect()
}

/// Run the demo with `args`, check that its `Next:` advice holds each of `expect`, run the advice
/// as written (in `dir`) and get the demo's figure back to the printed precision.
fn next_line_reproduces(dir: &std::path::Path, args: &[&str], expect: &[&str]) {
    let out = demo(args);
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
    for e in expect {
        assert!(next.contains(e), "no `{e}` in {next}");
    }
    let words = |cmd: &str| -> Vec<String> {
        cmd.split_whitespace()
            .skip(1)
            .map(|w| {
                if w == "plan.json" {
                    dir.join("plan.json").display().to_string()
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
        "demo said {ms} ms, the plan simulates {got} ms ({next})"
    );
}

/// `dir/t.csv` written by `fcp trace gen ARGS`; its path.
fn generated_trace(dir: &std::path::Path, args: &[&str]) -> String {
    let trace = dir.join("t.csv");
    fcp()
        .args(["trace", "gen"])
        .args(args)
        .arg("-o")
        .arg(&trace)
        .assert()
        .success();
    trace.to_str().unwrap().to_string()
}

/// Regression: the `Next:` line dropped `--trace`, `--hardware` and `--model`, so following it
/// planned the bundled trace for an H100 instead of what the demo had just compared.
#[test]
fn the_next_line_replans_what_the_demo_recommended() {
    let dir = tempfile::tempdir().unwrap();
    let trace = generated_trace(
        dir.path(),
        &["--source", "wlb-llm", "--docs", "300", "--seed", "5"],
    );
    let trace = trace.as_str();
    let with_trace = format!("--trace {trace}");
    next_line_reproduces(
        dir.path(),
        &[
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
        ],
        &[&with_trace, "--hardware b200 --model llama3-8b"],
    );
}

/// The demo takes the packing, mask and pass that `compare` takes, says so in its header, and
/// its advice carries them.
#[test]
fn the_demo_plans_windows_full_masks_and_inference_too() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--ranks",
        "4",
        "--pack",
        "window",
        "--context",
        "16384",
        "--mask",
        "full",
        "--pass",
        "fwd",
        "--batches",
        "1",
    ];
    let out = demo(&args);
    let header = out.lines().next().unwrap();
    for want in ["16384-token windows", "full", "inference (fwd)"] {
        assert!(header.contains(want), "no `{want}` in {header}");
    }
    next_line_reproduces(
        dir.path(),
        &args,
        &["--pack window --context 16384", "--mask full", "--pass fwd"],
    );
}

/// Under tensor parallelism the header names the split and the advice plans under it: the
/// plan records its TP degree, so `simulate` needs no `--tp` to reproduce the figure, only
/// the layer settings the demo priced.
#[test]
fn the_demo_under_tp_advises_a_plan_under_tp() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--tp",
        "4",
        "--batches",
        "1",
        "--recompute",
        "full",
        "--tp-overlap",
    ];
    let out = demo(&args);
    let header = out.lines().next().unwrap();
    assert!(
        header.contains("h100 / llama3-70b · TP 4")
            && header.ends_with("· recompute full · TP collectives overlapped"),
        "{header}"
    );
    next_line_reproduces(
        dir.path(),
        &args,
        &[
            "--tp 4 --recompute full --tp-overlap -o plan.json",
            "--layer --recompute full --tp-overlap",
        ],
    );
}

/// Bug hunt: under `--pass fwd` the advice planned for a training step (`fcp plan` had no
/// `--pass`), and `hybrid` then chose another candidate: 0.789 ms forward where the demo said
/// 0.717. The advice now plans for the pass the demo judged.
#[test]
fn regression_the_next_line_under_pass_fwd_planned_for_training() {
    let dir = tempfile::tempdir().unwrap();
    let trace = generated_trace(dir.path(), &["--source", "pile", "--seed", "1"]);
    let trace = trace.as_str();
    next_line_reproduces(
        dir.path(),
        &[
            "--trace",
            trace,
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
            "--batches",
            "1",
            "--pass",
            "fwd",
        ],
        &["--pass fwd -o plan.json", "simulate plan.json --pass fwd"],
    );
}

/// Regression (bug hunt): with the trace on stdin the advice said `--trace -`, which cannot
/// be replayed once the trace was read; it names a file and says to save the trace there.
#[test]
fn regression_a_trace_from_stdin_is_advised_saved_to_a_file() {
    let next = support::stdout_of(
        fcp()
            .args(["demo", "--trace", "-", "--ranks", "2"])
            .write_stdin("doc_len\n100\n200\n"),
    );
    let next = next.lines().last().unwrap();
    assert!(next.contains("--trace trace.csv"), "{next}");
    assert!(!next.contains("--trace -"), "{next}");
    assert!(
        next.contains("the trace came on stdin: save it as trace.csv first"),
        "{next}"
    );
}
