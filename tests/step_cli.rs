//! End-to-end: a training step around the layer (`--micro-batches`, `--dp-overlap`): the
//! pipeline's bubble and the data-parallel collectives once a step.

mod support;

use support::{fcp, json, plan_with_tp as plan, stderr_of, stdout_of, sweep_results, tpcp_16};

use predicates::prelude::*;
use serde_json::Value;

/// The rows of two runs of the same study side by side, those that ran (same splits and
/// schemes, so the same rows run in both).
fn ran_pairs<'a>(a: &'a Value, b: &'a Value) -> impl Iterator<Item = (&'a Value, &'a Value)> {
    let rows = |v: &'a Value| v.as_array().expect("JSON rows").iter();
    rows(a).zip(rows(b)).filter(|(x, _)| x["error"].is_null())
}

/// `fcp tpcp` as [`tpcp_16`] runs it, on `batches` windows, hybrid alone, in JSON.
fn tpcp_16_json(batches: &str) -> assert_cmd::Command {
    let mut cmd = fcp();
    cmd.args(["tpcp", "--gpus", "16", "--context", "32768", "--json"])
        .args(["--schemes", "hybrid:quick=true", "--batches", batches]);
    cmd
}

/// `fcp tpcp` as [`tpcp_16`] runs it refuses each of `cases` (extra arguments, what the
/// error says), printing nothing.
fn tpcp_refuses(cases: &[(&[&str], &str)]) {
    refused(&tpcp_16("hybrid:quick=true"), cases);
}

/// The command `base` refuses each of `cases` (extra arguments, what the error says) with
/// exit 2, printing nothing.
fn refused(base: &[&str], cases: &[(&[&str], &str)]) {
    for (args, says) in cases {
        fcp()
            .args(base)
            .args(*args)
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(*says));
    }
}

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
        // Llama-3-70B's 80 layers over 4 stages; one window, so 8 equal micro-batches:
        // 8 + 3 slots, 3 of them the bubble, and the sends between the stages on top (at
        // least the first forward's 3 and the last backward's 3, at most two a slot).
        assert_eq!(s["stage_layers"], 20);
        assert_eq!(
            (s["micro_batches"].as_u64(), s["windows"].as_u64()),
            (Some(8), Some(1))
        );
        // The last stage also runs the output layer on each.
        let (slot, send, head) = (20.0 * layer, f(s, "pp_send_ms"), f(s, "output_layer_ms"));
        assert!(send > 0.0 && head > 0.0, "{s}");
        let pipeline = f(s, "pipeline_ms");
        assert!(
            pipeline >= 11.0 * slot + 8.0 * head + 6.0 * send - 1e-6,
            "{s}"
        );
        assert!(pipeline <= 11.0 * (slot + head + 2.0 * send) + 1e-6, "{s}");
        let busiest = 8.0 * (slot + head);
        assert!(
            (f(s, "bubble_ms") - (pipeline - busiest)).abs() < 1e-6,
            "{s}"
        );
        assert_eq!(f(s, "micro_batch_max_ms"), f(s, "micro_batch_mean_ms"));
        assert_eq!(
            (f(s, "dp_wait_ms"), s["micro_batch_order"].as_str()),
            (0.0, Some("stream"))
        );
        // Without overlap every data-parallel collective is exposed.
        assert_eq!(f(s, "dp_exposed_ms"), f(s, "dp_comm_ms"));
        assert!(s.get("dp_overlap").is_none());
        assert!(
            (f(s, "step_ms") - f(s, "pipeline_ms") - f(s, "dp_exposed_ms") - f(s, "optimizer_ms"))
                .abs()
                < 1e-6
        );
        assert!(f(s, "optimizer_ms") > 0.0);
        // 8 windows of real tokens over 16 GPUs × 4 stages.
        let tokens = f(s, "tokens_per_gpu_s") * f(s, "step_ms") * 1e-3 * 64.0 / 8.0;
        assert!(tokens > 30_000.0 && tokens <= 32_768.0 + 1e-6, "{tokens}");
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
    for (a, b) in ran_pairs(&plain, &over) {
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
        (&["--micro-batches", "0"], "1 to 65536 micro-batches"),
        (
            &["--micro-batches", "4", "--model", "llama3-8b", "--pp", "3"],
            "does not divide",
        ),
    ];
    tpcp_refuses(&cases);
}

/// Interleaving each stage's layers in chunks (Megatron's virtual pipeline stages) cuts the
/// bubble of equal micro-batches by the chunks, for more activations in flight on the first
/// stage; the text and the JSON say so, and the settings it cannot run are refused.
#[test]
fn interleaved_stages_shrink_the_bubble_and_hold_more_activations() {
    // The JSON rows of PP 4 interleaved over `vp` chunks, a step of `m` micro-batches.
    let run = |vp: &str, m: &str| {
        json(fcp().args(tpcp_16("hybrid:quick=true")).args([
            "--json",
            "--pp",
            "4",
            "--vp",
            vp,
            "--micro-batches",
            m,
        ]))
    };
    let (plain, two) = (run("1", "8"), run("2", "8"));
    let mut compared = 0;
    for (a, b) in ran_pairs(&plain, &two) {
        let (sa, sb) = (&a["step"], &b["step"]);
        assert!(sa.get("vp").is_none(), "{sa}");
        assert_eq!(sb["vp"], 2);
        assert_eq!(b["footprint"]["vp"], 2);
        assert!(a["footprint"].get("vp").is_none());
        // One window: equal micro-batches, 3 slots of bubble against 1.5 (the sends aside).
        let slot = 20.0 * f(a, "layer_time_ms");
        let (bubble_a, bubble_b) = (f(sa, "bubble_ms"), f(sb, "bubble_ms"));
        assert!(bubble_a >= 3.0 * slot - 1e-6, "{sa}");
        assert!(bubble_b < bubble_a && bubble_b >= 1.5 * slot - 1e-6, "{sb}");
        assert!(f(sb, "step_ms") < f(sa, "step_ms"));
        // The first stage keeps 80 · (1 + 3/8) = 110 layers' activations, not 80.
        let (fa, fb) = (&a["footprint"], &b["footprint"]);
        assert_eq!(
            (
                fa["activation_layers"].as_u64(),
                fb["activation_layers"].as_u64()
            ),
            (Some(80), Some(110))
        );
        assert!(f(fb, "activation_bytes") > f(fa, "activation_bytes"));
        compared += 1;
    }
    assert!(compared >= 2, "{two}");
    let text = |more: &[&str]| {
        stdout_of(
            fcp()
                .args(tpcp_16("hybrid:quick=true"))
                .args(["--pp", "4", "--vp", "2", "--micro-batches", "8"])
                .args(more),
        )
    };
    // Nothing fits: the advice names the chunks.
    let tight = text(&[]);
    assert!(tight.contains("PP 4 × 2 chunks interleaved"), "{tight}");
    assert!(
        tight.contains("110 layers' worth: 11 chunks of 10 layers in flight"),
        "{tight}"
    );
    assert!(
        tight.contains("interleave fewer chunks a stage (a smaller --vp)"),
        "{tight}"
    );
    let fits = text(&["--recompute", "full"]);
    assert!(
        fits.contains("20 layers a stage in 2 interleaved chunks of 10 layers at"),
        "{fits}"
    );
    // Regression (bug hunt): a step of exactly --pp micro-batches runs every forward before
    // any backward, 8 chunks of 10 layers on the first stage, as many as without
    // interleaving; the count said 11 chunks and found nothing that fits.
    let (one, two) = (run("1", "4"), run("2", "4"));
    for (a, b) in ran_pairs(&one, &two) {
        assert_eq!(b["footprint"]["activation_layers"], 80, "{b}");
        assert_eq!(
            a["footprint"]["activation_bytes"],
            b["footprint"]["activation_bytes"]
        );
    }
    let cases: [(&[&str], &str); 4] = [
        (&["--vp", "2"], "it needs --pp 2 or more"),
        (
            &["--pp", "4", "--vp", "3"],
            "--pp 4 × --vp 3 does not divide",
        ),
        (
            &["--pp", "4", "--vp", "2", "--micro-batches", "6"],
            "not a multiple of the 4 pipeline stages",
        ),
        (&["--pp", "4", "--vp", "0"], "1 to 1000 chunks"),
    ];
    tpcp_refuses(&cases);
    fcp()
        .args(["compare", "--ranks", "8", "--vp", "2"])
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "--vp sets how the GPU-memory count",
        ));
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
    // 4 copies of the batch through 2 stages of 40 layers: 5 slots, and the sends.
    let (slot, send, head) = (40.0 * layer, f(s, "pp_send_ms"), f(s, "output_layer_ms"));
    let pipeline = f(s, "pipeline_ms");
    assert!(
        pipeline >= 5.0 * slot + 4.0 * head + 2.0 * send - 1e-6,
        "{s}"
    );
    assert!(pipeline <= 5.0 * (slot + head + 2.0 * send) + 1e-6, "{s}");
    assert_eq!(s["windows"], 1);
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
        .split("a step of 2 micro-batches, ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rate in {tiny}"));
    assert!(rate > 0.0, "{tiny}");
}

/// Each micro-batch runs at its own window's layer time: unequal windows stall a pipeline
/// beyond its bubble, the hill order takes back what it can, and a step that needs more
/// windows than were simulated says it draws them in turn.
#[test]
fn unequal_windows_stall_the_pipeline_and_the_hill_order_takes_it_back() {
    let run = |order: Option<&str>, batches: &str| {
        let mut cmd = tpcp_16_json(batches);
        cmd.args(["--pp", "4", "--micro-batches", "8"]);
        if let Some(o) = order {
            cmd.args(["--micro-batch-order", o]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
        (rows, String::from_utf8(out.stderr).unwrap())
    };
    let (stream, note) = run(None, "8");
    assert!(!note.contains("drawn in turn"), "{note}");
    let (hill, _) = run(Some("hill"), "8");
    let mut saved = false;
    for (a, b) in ran_pairs(&stream, &hill) {
        let (s, h) = (&a["step"], &b["step"]);
        assert_eq!(s["windows"], 8);
        assert!(
            f(s, "micro_batch_max_ms") > f(s, "micro_batch_mean_ms"),
            "{s}"
        );
        // Every replica's work is the same in any order: only the waiting changes.
        let work = |x: &Value| f(x, "pipeline_ms") - f(x, "bubble_ms");
        assert!((work(s) - work(h)).abs() < 1e-6, "{s} {h}");
        // The stream's row says what the hill order would take, and the hill run agrees.
        assert_eq!(h["micro_batch_order"], "hill");
        assert!(b.get("hill_step_ms").is_none(), "{b}");
        assert!((f(a, "hill_step_ms") - f(h, "step_ms")).abs() < 1e-6, "{a}");
        // And the hill's row says what the stream's order takes: neither always wins.
        assert!(
            (f(b, "stream_order_step_ms") - f(s, "step_ms")).abs() < 1e-6,
            "{b}"
        );
        assert!(a.get("stream_order_step_ms").is_none(), "{a}");
        assert!(f(s, "stall_ms") <= f(s, "bubble_ms"), "{s}");
        assert!(f(h, "step_ms") <= f(s, "step_ms") + 1e-6, "{s} {h}");
        saved |= f(h, "step_ms") < f(s, "step_ms");
    }
    assert!(saved, "{stream}");
    // Fewer windows than the step's micro-batches: they repeat, and the note says so.
    let (_, note) = run(None, "2");
    assert!(
        note.contains("a step trains 8 micro-batches and they are drawn in turn from 2 simulated windows: --batches 8"),
        "{note}"
    );
    // An order without a step to order is refused.
    fcp()
        .args(tpcp_16("zigzag"))
        .args(["--micro-batch-order", "hill"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--micro-batches"));
}

/// Dealing the windows LPT never leaves a replica waiting longer than the stream's deal,
/// trains the same tokens, and the stream's row says what it would save.
#[test]
fn an_lpt_deal_shortens_the_wait_for_the_slowest_replica() {
    let run = |deal: &str| {
        json(tpcp_16_json("8").args(["--dp", "2", "--micro-batches", "4", "--deal", deal]))
    };
    let (stream, lpt) = (run("stream"), run("lpt"));
    let mut waited = false;
    for (a, b) in ran_pairs(&stream, &lpt) {
        let (s, l) = (&a["step"], &b["step"]);
        assert_eq!(
            (s["deal"].as_str(), l["deal"].as_str()),
            (Some("stream"), Some("lpt"))
        );
        assert!(f(l, "step_ms") <= f(s, "step_ms") + 1e-6, "{s} {l}");
        assert!(f(l, "dp_wait_ms") <= f(s, "dp_wait_ms") + 1e-6, "{s} {l}");
        let tokens = |x: &Value| f(x, "tokens_per_gpu_s") * f(x, "step_ms");
        assert!((tokens(s) - tokens(l)).abs() < 1e-6 * tokens(s), "{s} {l}");
        assert!((f(a, "lpt_step_ms") - f(l, "step_ms")).abs() < 1e-6, "{a}");
        assert!(b.get("lpt_step_ms").is_none(), "{b}");
        waited |= f(s, "dp_wait_ms") > 0.0;
    }
    assert!(waited, "{stream}");
}

/// Regression (bug hunt): when no split fits, the answer named the fastest but not what
/// the other micro-batch order would save it; a trace too short for a window per
/// micro-batch was told to ask for more `--batches`; and a step of 65,536 micro-batches on
/// each of 65,536 replicas was counted as 4,294,967,295.
#[test]
fn the_step_s_notes_and_levers_hold_at_the_edges() {
    let text = stdout_of(fcp().args([
        "tpcp",
        "--gpus",
        "8",
        "--context",
        "32768",
        "--batches",
        "4",
        "--schemes",
        "zigzag",
        "--micro-batches",
        "4",
        "--pp",
        "2",
    ]));
    assert!(text.contains("No split fits in memory"), "{text}");
    assert!(
        text.contains("In hill order") || text.contains("In the stream's order"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("three.csv");
    std::fs::write(&trace, "doc_len\n32768\n32768\n32768\n").unwrap();
    // Four micro-batches from a trace of three 32K windows, `batches` of them simulated.
    let note = |batches: &str| {
        stderr_of(
            fcp()
                .args(["tpcp", "--gpus", "8", "--context", "32768"])
                .args(["--schemes", "zigzag", "--model", "llama3-8b"])
                .args(["--micro-batches", "4", "--batches", batches, "--trace"])
                .arg(&trace),
        )
    };
    let all = note("8");
    assert!(
        all.contains("drawn in turn from 3 simulated windows: the trace packs into only 3 windows of 32768 tokens\n"),
        "{all}"
    );
    // More windows than simulated, fewer than the step needs: ask for them all.
    let one = note("1");
    assert!(
        one.contains(
            "the trace packs into only 3 windows of 32768 tokens (--batches 3 simulates them all)"
        ),
        "{one}"
    );
    let wide = stderr_of(fcp().args(tpcp_16("zigzag")).args([
        "--micro-batches",
        "65536",
        "--dp",
        "65536",
    ]));
    assert!(
        wide.contains("a step trains 4294967296 micro-batches (65536 on each of 65536 replicas)"),
        "{wide}"
    );
}

/// Regression (bug hunt): every window's output layer and pipeline sends were priced at a
/// full window's tokens per rank, so a trace's short last window of 1,000 tokens paid
/// 130 ms of output layer (TP 8 × CP 1) for a 1.8 ms layer. And levers that change nothing
/// say so.
#[test]
fn a_short_window_pays_for_its_own_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tiny.csv");
    std::fs::write(&trace, "doc_len\n1000\n").unwrap();
    let rows = json(
        fcp()
            .args(["tpcp", "--gpus", "8", "--schemes", "zigzag", "--json"])
            .args(["--micro-batches", "4", "--pp", "2", "--trace"])
            .arg(&trace),
    );
    let tp8 = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tp"] == 8)
        .unwrap();
    // 1,000 tokens × 2 × 8192 × 16,032 words, forward and twice backward, at ~800 TFLOP/s.
    let head = f(&tp8["step"], "output_layer_ms");
    assert!(head > 0.5 && head < 2.0, "{tp8}");
    assert!(f(&tp8["step"], "pp_send_ms") < 0.1, "{tp8}");
    let note = stderr_of(fcp().args(tpcp_16("zigzag")).args([
        "--micro-batches",
        "4",
        "--micro-batch-order",
        "hill",
        "--deal",
        "lpt",
    ]));
    assert!(
        note.contains("--micro-batch-order hill changes nothing without a pipeline"),
        "{note}"
    );
    assert!(
        note.contains("--deal lpt changes nothing with one replica"),
        "{note}"
    );
}

/// `compare --micro-batches` prices each scheme's step over the compared batches, in order:
/// without a pipeline, every batch's layers and output layer back to back, then the
/// data-parallel reduction.
#[test]
fn compare_prices_each_scheme_s_step_over_its_batches() {
    let args = [
        "compare",
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--model",
        "llama3-8b",
        "--schemes",
        "zigzag,fcp",
        "--batches",
        "3",
        "--layer",
        "--memory",
        "--micro-batches",
        "3",
    ];
    let rows = json(fcp().args(args).arg("--json"));
    for r in rows.as_array().unwrap() {
        let s = &r["step"];
        assert_eq!(
            (s["windows"].as_u64(), s["stage_layers"].as_u64()),
            (Some(3), Some(32))
        );
        let layers = 3.0 * 32.0 * f(r, "layer_time_ms");
        let heads = 3.0 * f(s, "output_layer_ms");
        assert!((f(s, "pipeline_ms") - layers - heads).abs() < 1e-6, "{r}");
        assert!(
            (f(s, "step_ms") - f(s, "pipeline_ms") - f(s, "dp_exposed_ms") - f(s, "optimizer_ms"))
                .abs()
                < 1e-6
        );
        assert!(f(s, "optimizer_ms") > 0.0);
    }
    let csv = stdout_of(fcp().args(args).arg("--csv"));
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .ends_with(",micro_batches,step_ms,tokens_per_gpu_s"),
        "{csv}"
    );
    let text = stdout_of(fcp().args(args));
    assert!(
        text.contains("step of 3 micro-batches") && text.contains("tok/s/GPU"),
        "{text}"
    );
    fcp()
        .args(["compare", "--ranks", "4", "--schemes", "zigzag", "--layer"])
        .args(["--micro-batches", "3"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--layer --memory"));
}

/// Regression (bug hunt): compare left batches out of its step, or repeated them, without
/// a word; refused --pass fwd only after planning every scheme, naming `simulate`; and said
/// --dp-overlap changed nothing when no scheme ran at all.
#[test]
fn compare_says_which_batches_its_step_trains() {
    let base = [
        "compare",
        "--ranks",
        "8",
        "--schemes",
        "ring",
        "--layer",
        "--memory",
    ];
    let note = |args: &[&str]| stderr_of(fcp().args(base).args(args));
    let left = note(&["--batches", "8", "--micro-batches", "2"]);
    assert!(
        left.contains("the step trains the first 2 of the 8 batches"),
        "{left}"
    );
    let repeated = note(&["--batches", "2", "--micro-batches", "4", "--dp", "2"]);
    assert!(
        repeated.contains("a step trains 8 micro-batches (4 on each of 2 replicas) and they are drawn in turn from 2 batches: --batches 8 gives each its own"),
        "{repeated}"
    );
    fcp()
        .args(base)
        .args(["--micro-batches", "4", "--pass", "fwd"])
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "a training step (--micro-batches) runs both passes: --pass fwd leaves one out",
        ));
    fcp()
        .args(["compare", "--ranks", "3", "--schemes", "ulysses", "--layer"])
        .args(["--memory", "--micro-batches", "4", "--dp-overlap"])
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("no scheme could plan")
                .and(predicate::str::contains("--dp-overlap changes nothing").not()),
        );
}

/// A sweep's cell prices its step as `compare` prices a scheme's: the cell's batches as the
/// micro-batches, in order, cycling when the step needs more. (Before, each batch's step
/// was its own copies, blind to the stalls unequal batches cause.)
#[test]
fn a_sweep_cell_s_step_is_compare_s_over_the_same_batches() {
    let results = sweep_results(
        "batches = 3\npack = \"window\"\nlayer = true\n[memory]\npp = 2\nmicro_batches = 4\n[grid]\ntraces = [\"default\"]\nschemes = [\"fcp\"]\nranks = [8]\ncontext = [65536]\n",
    );
    let step = &results[0]["metrics"]["step_ms"];
    // One figure per cell.
    assert_eq!(step["mean"], step["max"], "{step}");
    let rows = json(fcp().args([
        "compare",
        "--schemes",
        "fcp",
        "--ranks",
        "8",
        "--pack",
        "window",
        "--context",
        "65536",
        "--batches",
        "3",
        "--layer",
        "--memory",
        "--pp",
        "2",
        "--micro-batches",
        "4",
        "--json",
    ]));
    let (c, s) = (
        f(&rows[0]["step"], "step_ms"),
        step["mean"].as_f64().unwrap(),
    );
    assert!((c - s).abs() < 1e-6, "compare {c} vs sweep {s}");
    // Three unequal batches through a pipeline: more than four copies of the lightest.
    assert!(f(&rows[0]["step"], "micro_batch_max_ms") > f(&rows[0]["step"], "micro_batch_mean_ms"));
}

/// `compare --from-batch K` starts at batch K of the packed trace: two batches' mean is the
/// mean of the first alone and of the second alone, and a start past the trace is refused.
#[test]
fn compare_from_batch_starts_later_in_the_trace() {
    let mean = |extra: &[&str]| {
        let v = json(
            fcp()
                .args(["compare", "--ranks", "4", "--schemes", "zigzag", "--json"])
                .args(extra),
        );
        f(&v[0], "attention_time_ms")
    };
    let both = mean(&["--batches", "2"]);
    let first = mean(&["--batches", "1"]);
    let second = mean(&["--batches", "1", "--from-batch", "1"]);
    assert_ne!(first, second);
    assert!(
        ((first + second) / 2.0 - both).abs() < 1e-9 * both,
        "{first} {second} {both}"
    );
    fcp()
        .args(["compare", "--ranks", "4", "--schemes", "zigzag"])
        .args(["--from-batch", "1000000"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains(
            "--from-batch 1000000 leaves no batch",
        ));
}

/// `compare` of zigzag on 8 ranks, each a TP group of 8: the WLB tests' layout.
const COMPARE_8_TP8_ZIGZAG: [&str; 7] = [
    "compare",
    "--ranks",
    "8",
    "--tp",
    "8",
    "--schemes",
    "zigzag",
];

/// `compare --pack wlb` with a training step balances the step's `--micro-batches × --dp`
/// windows together: the step's micro-batches are within a few percent of each other, where
/// the same step of fixed windows is not.
#[test]
fn wlb_packing_evens_out_the_steps_micro_batches() {
    let spread = |pack: &[&str]| {
        let v = json(
            fcp()
                .args(COMPARE_8_TP8_ZIGZAG)
                .args(["--context", "131072", "--layer", "--memory", "--pp", "4"])
                .args(["--micro-batches", "4", "--dp", "2", "--batches", "8"])
                .args(["--from-batch", "16", "--json"])
                .args(pack),
        );
        let step = &v[0]["step"];
        f(step, "micro_batch_max_ms") / f(step, "micro_batch_mean_ms")
    };
    let wlb = spread(&["--pack", "wlb"]);
    let window = spread(&["--pack", "window"]);
    assert!(wlb < 1.05, "wlb {wlb}");
    assert!(window > wlb + 0.05, "window {window} wlb {wlb}");
}

/// `compare` of zigzag on 4 ranks with the layer and its memory: what the `--steps` tests
/// add a step to.
const COMPARE_4_ZIGZAG: [&str; 7] = [
    "compare",
    "--ranks",
    "4",
    "--schemes",
    "zigzag",
    "--layer",
    "--memory",
];

/// `compare --steps S` prices S consecutive steps, each on its own `--micro-batches × --dp`
/// windows: each step is the step `--from-batch` and `--batches` price alone, the mean and
/// the slowest follow from them, and the throughput weighs each step by its time.
#[test]
fn compare_steps_price_each_step_on_its_own_windows() {
    let run = |extra: &[&str]| {
        json(
            fcp()
                .args(["compare", "--ranks", "4", "--schemes", "zigzag", "--json"])
                .args(["--layer", "--memory", "--micro-batches", "2", "--dp", "2"])
                .args(extra),
        )
    };
    let v = run(&["--steps", "3"]);
    let row = &v[0];
    assert!(row.get("step").is_none(), "{row}");
    assert_eq!(row["batches"], 12);
    let steps = row["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3);
    let alone: Vec<Value> = (0..3)
        .map(|k| {
            let from = (4 * k).to_string();
            run(&["--from-batch", &from, "--batches", "4"])[0]["step"].clone()
        })
        .collect();
    assert_eq!(steps, &alone);
    let ms: Vec<f64> = alone.iter().map(|s| f(s, "step_ms")).collect();
    assert!(ms[0] != ms[1] || ms[1] != ms[2], "{ms:?}");
    let over = &row["over_steps"];
    assert_eq!(over["steps"], 3);
    let mean = ms.iter().sum::<f64>() / 3.0;
    assert!((f(over, "mean_step_ms") - mean).abs() < 1e-9 * mean);
    let (slowest, max) = ms
        .iter()
        .enumerate()
        .fold((0, ms[0]), |b, (i, &x)| if x > b.1 { (i, x) } else { b });
    assert_eq!(over["slowest_step"], slowest);
    assert_eq!(f(over, "max_step_ms"), max);
    let trained: f64 = alone
        .iter()
        .map(|s| f(s, "tokens_per_gpu_s") * f(s, "step_ms"))
        .sum();
    let rate = trained / ms.iter().sum::<f64>();
    assert!((f(over, "tokens_per_gpu_s") - rate).abs() < 1e-9 * rate);
    // The table and the CSV carry the mean, the slowest and the rate over all steps.
    let args = COMPARE_4_ZIGZAG;
    let table =
        stdout_of(
            fcp()
                .args(args)
                .args(["--micro-batches", "2", "--dp", "2", "--steps", "3"]),
        );
    assert!(table.contains("max_step"), "{table}");
    assert!(
        table.contains("mean of 3 consecutive training steps"),
        "{table}"
    );
    let csv = stdout_of(fcp().args(args).args([
        "--micro-batches",
        "2",
        "--dp",
        "2",
        "--steps",
        "3",
        "--csv",
    ]));
    let header = csv.lines().next().unwrap();
    assert!(
        header.ends_with(",step_ms,tokens_per_gpu_s,steps,max_step_ms,slowest_step"),
        "{header}"
    );
}

/// `--steps` is refused without a step to repeat, at zero, or beside a `--batches` that
/// would have the steps share or skip windows; a trace too short for every step asked prices
/// the whole steps it holds and says so.
#[test]
fn compare_steps_refusals_and_a_short_trace() {
    let base = ["compare", "--ranks", "4", "--schemes", "zigzag"];
    for (extra, says) in [
        (&["--steps", "2"][..], "--micro-batches"),
        (
            &[
                "--layer",
                "--memory",
                "--micro-batches",
                "2",
                "--steps",
                "0",
            ][..],
            "--steps must be at least 1",
        ),
        (
            &[
                "--layer",
                "--memory",
                "--micro-batches",
                "2",
                "--steps",
                "2",
                "--batches",
                "3",
            ][..],
            "--batches must be 4, or left out",
        ),
    ] {
        refused(&base, &[(extra, says)]);
    }
    // A thousand steps of 50 windows are more than the bundled trace holds: the whole steps
    // it does hold are priced, the rest said.
    let out = fcp()
        .args(base)
        .args(["--layer", "--memory", "--micro-batches", "50"])
        .args(["--steps", "1000", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("whole steps of 50 priced, not 1000"), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps = v[0]["over_steps"]["steps"].as_u64().unwrap();
    assert_eq!(v[0]["batches"].as_u64().unwrap(), 50 * steps);
    assert!(steps >= 2, "{steps}");
    // Regression (bug hunt): a run cut to one step, or `--steps 1`, answered in `step`
    // without `steps` and `over_steps`; the output's shape follows `--steps`.
    let v = json(
        fcp()
            .args(base)
            .args(["--layer", "--memory", "--micro-batches", "2"])
            .args(["--steps", "1", "--json"]),
    );
    assert!(v[0].get("step").is_none(), "{}", v[0]);
    assert_eq!(v[0]["over_steps"]["steps"], 1);
    assert_eq!(v[0]["steps"].as_array().map(Vec::len), Some(1));
}

/// Regressions (bug hunt): notes that `--steps` lost or got wrong. `--dp-overlap` with
/// nothing to overlap said so without `--steps` only; a trace that ran out was told to
/// `--batches` it already had.
#[test]
fn compare_step_notes_follow_the_steps_priced() {
    let base = COMPARE_4_ZIGZAG;
    let err = stderr_of(fcp().args(base).args([
        "--micro-batches",
        "2",
        "--zero",
        "3",
        "--dp-overlap",
        "--steps",
        "2",
    ]));
    assert!(err.contains("--dp-overlap changes nothing"), "{err}");
    // The bundled trace packs into 138 batches at 4 ranks: from 136, two are left.
    let err = stderr_of(fcp().args(base).args([
        "--micro-batches",
        "4",
        "--from-batch",
        "136",
        "--batches",
        "4",
    ]));
    assert!(
        err.contains("from 2 batches: the trace holds no more from batch 136"),
        "{err}"
    );
}

/// Under `--pack wlb`, `--steps` prices WLB's own steps: each one's micro-batches are
/// balanced together (within a few percent of each other). Steps that do not line up with
/// WLB's (another group, a start inside a step) are said.
#[test]
fn compare_steps_under_wlb_are_wlbs_steps() {
    let cmd = |extra: &[&str]| {
        let mut c = fcp();
        c.args(COMPARE_8_TP8_ZIGZAG)
            .args([
                "--pack",
                "wlb",
                "--context",
                "131072",
                "--layer",
                "--memory",
            ])
            .args([
                "--pp",
                "4",
                "--micro-batches",
                "4",
                "--dp",
                "2",
                "--steps",
                "2",
            ])
            .args(extra);
        c
    };
    let v = json(&mut cmd(&["--from-batch", "16", "--json"]));
    let steps = v[0]["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2);
    for s in steps {
        let spread = f(s, "micro_batch_max_ms") / f(s, "micro_batch_mean_ms");
        assert!(spread < 1.05, "{spread} in {s}");
    }
    for (extra, says) in [
        (
            &["--from-batch", "12"][..],
            "--from-batch 12 is not a multiple",
        ),
        (&["--wlb-group", "4"][..], "they are not WLB's steps"),
    ] {
        let err = stderr_of(&mut cmd(extra));
        assert!(err.contains(says), "{err}");
    }
    assert!(!stderr_of(&mut cmd(&["--from-batch", "8"])).contains("WLB"));
}

/// A sweep's `pack = "wlb"` cell is `compare --pack wlb` with the same settings: the same
/// micro-batches (the group from the step, the breakpoint from the model), the same numbers.
#[test]
fn a_sweep_cell_packs_wlb_as_compare_does() {
    let results = sweep_results(
        "batches = 4\npack = \"wlb\"\nlayer = true\n[memory]\npp = 2\nmicro_batches = 2\ndp = 2\n[wlb]\noutlier = 8192\n[grid]\ntraces = [\"default\"]\nschemes = [\"zigzag\"]\nranks = [4]\ncontext = [32768]\n",
    );
    let cell = &results[0];
    assert!(cell["error"].is_null(), "{cell}");
    let rows = json(
        fcp()
            .args(["compare", "--schemes", "zigzag", "--ranks", "4"])
            .args([
                "--pack",
                "wlb",
                "--context",
                "32768",
                "--wlb-outlier",
                "8192",
            ])
            .args(["--batches", "4", "--layer", "--memory", "--pp", "2"])
            .args(["--micro-batches", "2", "--dp", "2", "--json"]),
    );
    let m = &cell["metrics"];
    for (c, s) in [
        (
            f(&rows[0], "attention_time_ms"),
            m["attention_time_ms"]["mean"].as_f64().unwrap(),
        ),
        (
            f(&rows[0]["step"], "step_ms"),
            m["step_ms"]["mean"].as_f64().unwrap(),
        ),
    ] {
        assert!((c - s).abs() < 1e-9 * c, "compare {c} vs sweep {s}");
    }
    // Per-rank tokens: the share of the longest micro-batch, as on the command line.
    assert_eq!(cell["tokens_per_rank"], 16384);
}

/// A sweep's `[memory] steps = S` prices its batches as S steps, as `compare --steps S`
/// does: the cell's `step_ms` mean and max are the comparison's mean and slowest step, p50
/// one of the steps.
#[test]
fn a_sweep_cell_s_steps_are_compare_s() {
    let results = sweep_results(
        "batches = 12\nlayer = true\n[memory]\npp = 2\nmicro_batches = 2\ndp = 2\nsteps = 3\n[grid]\ntraces = [\"default\"]\nschemes = [\"zigzag\"]\nranks = [4]\n",
    );
    let step = &results[0]["metrics"]["step_ms"];
    let rows = json(
        fcp()
            .args(["compare", "--schemes", "zigzag", "--ranks", "4", "--layer"])
            .args(["--memory", "--pp", "2", "--micro-batches", "2", "--dp", "2"])
            .args(["--steps", "3", "--json"]),
    );
    let over = &rows[0]["over_steps"];
    assert_eq!(step["mean"].as_f64(), over["mean_step_ms"].as_f64());
    assert_eq!(step["max"].as_f64(), over["max_step_ms"].as_f64());
    let each: Vec<f64> = rows[0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| f(s, "step_ms"))
        .collect();
    assert!(
        each.contains(&step["p50"].as_f64().unwrap()),
        "{step} {each:?}"
    );
    assert!(each.iter().any(|&x| x != each[0]), "{each:?}");
}

/// Regression (bug hunt): a trace short of a sweep cell's steps averaged its plan metrics
/// over a part-step the step metrics left out; the cell keeps its whole steps, as `compare
/// --steps` does.
#[test]
fn a_sweep_cell_short_of_its_steps_keeps_the_whole_ones() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    // Six documents of 40,000 tokens fill three windows of 65,536 (each cuts its second):
    // one whole step of two micro-batches and a part-step, where the config asks for three.
    std::fs::write(&trace, format!("doc_len{}\n", "\n40000".repeat(6))).unwrap();
    let results = sweep_results(&format!(
        "batches = 6\npack = \"window\"\nlayer = true\n[memory]\nmicro_batches = 2\nsteps = 3\n[grid]\ntraces = [{:?}]\nschemes = [\"zigzag\"]\nranks = [4]\ncontext = [65536]\n",
        trace.display().to_string()
    ));
    let cell = &results[0];
    let rows = json(
        fcp()
            .arg("compare")
            .arg("--trace")
            .arg(&trace)
            .args(["--ranks", "4", "--pack", "window", "--context", "65536"])
            .args([
                "--layer",
                "--memory",
                "--micro-batches",
                "2",
                "--steps",
                "3",
            ])
            .args(["--schemes", "zigzag", "--json"]),
    );
    assert_eq!(rows[0]["batches"], 2, "{}", rows[0]);
    assert_eq!(cell["batches"], 2, "{cell}");
    assert_eq!(
        cell["metrics"]["attention_time_ms"]["mean"].as_f64(),
        rows[0]["attention_time_ms"].as_f64()
    );
}

/// `fcp tpcp --steps`: each split's steps are `compare --steps` at that split (same windows,
/// same step), the levers are the mean step's under the other order, and the rows rank by
/// the mean step.
#[test]
fn tpcp_steps_are_compare_steps_at_each_split() {
    // Recomputing, the fastest split fits in memory (the answer then names it first).
    let step = [
        "--pp",
        "2",
        "--micro-batches",
        "2",
        "--dp",
        "2",
        "--recompute",
        "full",
    ];
    let rows = json(
        fcp()
            .args(["tpcp", "--gpus", "16", "--context", "32768"])
            .args(["--schemes", "zigzag", "--steps", "3", "--json"])
            .args(step),
    );
    let rows = rows.as_array().unwrap();
    let ran: Vec<&Value> = rows.iter().filter(|r| r["error"].is_null()).collect();
    assert!(ran.len() >= 3, "{rows:?}");
    for r in &ran {
        assert!(r.get("step").is_none(), "{r}");
        assert_eq!(r["steps"].as_array().map(Vec::len), Some(3), "{r}");
        let (tp, cp) = (r["tp"].to_string(), r["cp"].to_string());
        let compared = |order: &str| {
            json(
                fcp()
                    .args([
                        "compare",
                        "--ranks",
                        &cp,
                        "--tp",
                        &tp,
                        "--schemes",
                        "zigzag",
                    ])
                    .args([
                        "--pack",
                        "window",
                        "--context",
                        "32768",
                        "--layer",
                        "--memory",
                    ])
                    .args(["--steps", "3", "--micro-batch-order", order, "--json"])
                    .args(step),
            )[0]
            .clone()
        };
        let c = compared("stream");
        assert_eq!(r["steps"], c["steps"], "TP {tp} × CP {cp}");
        assert_eq!(r["over_steps"], c["over_steps"], "TP {tp} × CP {cp}");
        let hill = compared("hill");
        assert_eq!(
            f(r, "hill_step_ms"),
            f(&hill["over_steps"], "mean_step_ms"),
            "TP {tp} × CP {cp}"
        );
    }
    // The answer names the split with the least mean step, and the table its slowest step.
    let mean = |r: &Value| f(&r["over_steps"], "mean_step_ms");
    let best = ran
        .iter()
        .min_by(|a, b| mean(a).total_cmp(&mean(b)))
        .unwrap();
    let text = stdout_of(
        fcp()
            .args(["tpcp", "--gpus", "16", "--context", "32768"])
            .args(["--schemes", "zigzag", "--steps", "3"])
            .args(step),
    );
    assert!(text.contains("max_step"), "{text}");
    assert!(text.contains(" · 3 steps"), "{text}");
    assert!(text.contains("the mean of 3 consecutive steps"), "{text}");
    let said = format!(
        "Fastest step that fits in memory: zigzag at TP {} × CP {}, {:.1} ms a step of 2 micro-batches (the mean of 3 steps;",
        best["tp"],
        best["cp"],
        mean(best)
    );
    assert!(text.contains(&said), "{said}\n{text}");
}

/// `tpcp --steps` refuses what `compare --steps` refuses, and a trace short of the steps
/// prices its whole steps and says so in windows.
#[test]
fn tpcp_steps_refusals_and_a_short_trace() {
    let base = [
        "tpcp",
        "--gpus",
        "8",
        "--context",
        "32768",
        "--schemes",
        "zigzag",
    ];
    for (extra, says) in [
        (&["--steps", "2"][..], "--micro-batches"),
        (
            &["--micro-batches", "2", "--steps", "0"][..],
            "--steps must be at least 1",
        ),
        (
            &["--micro-batches", "2", "--steps", "2", "--batches", "3"][..],
            "--batches must be 4, or left out",
        ),
    ] {
        refused(&base, &[(extra, says)]);
    }
    let out = fcp()
        .args(base)
        .args(["--micro-batches", "150", "--steps", "1000", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    // The bundled trace packs into 392 windows of 32K: two steps of 150.
    assert!(
        err.contains(
            "392 windows: 2 whole steps of 150 priced, not 1000 (the last 92 windows left out)"
        ),
        "{err}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["error"].is_null())
        .unwrap();
    assert_eq!(row["over_steps"]["steps"], 2, "{row}");
}

/// A hardware profile without `hbm_gbs` (one written before the field existed) prices the
/// step as before, without the optimizer step, and says so once; the bundled one prices it.
#[test]
fn a_profile_without_memory_bandwidth_leaves_the_optimizer_step_out_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("old-h100.toml");
    support::h100_without(&hw, "hbm_gbs");
    let step = ["--json", "--pp", "4", "--micro-batches", "8"];
    let run = |hardware: &[&std::ffi::OsStr]| {
        support::json_and_stderr(
            fcp()
                .args(tpcp_16("hybrid:quick=true"))
                .args(step)
                .args(hardware),
        )
    };
    let (old, note) = run(&["--hardware".as_ref(), hw.as_os_str()]);
    assert_eq!(
        note.matches("gives no `hbm_gbs`: the training step leaves out the optimizer step")
            .count(),
        1,
        "{note}"
    );
    let (bundled, note) = run(&[]);
    assert!(!note.contains("hbm_gbs"), "{note}");
    let pairs: Vec<_> = ran_pairs(&old, &bundled).collect();
    assert!(pairs.len() >= 2, "{old}");
    for (o, b) in pairs {
        let (so, sb) = (&o["step"], &b["step"]);
        assert_eq!(f(so, "optimizer_ms"), 0.0);
        assert!(f(sb, "optimizer_ms") > 0.0);
        assert!((f(sb, "step_ms") - f(so, "step_ms") - f(sb, "optimizer_ms")).abs() < 1e-6);
    }
}
