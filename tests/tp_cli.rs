//! End-to-end: tensor parallelism under CP (`--tp`) through plan, simulate, compare and sweep.

mod support;

use std::path::Path;
use support::{fcp, plan_with_tp as plan, stdout_of};

use predicates::prelude::*;
use serde_json::Value;

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn simulate_json(args: &[&str], plan: &Path) -> Value {
    let out = stdout_of(fcp().args(["simulate", "--json"]).args(args).arg(plan));
    serde_json::from_str(&out).unwrap()
}

#[test]
fn a_plan_made_under_tp_records_it_and_holds_one_gpus_heads() {
    let dir = tempfile::tempdir().unwrap();
    let whole = read(&plan(dir.path(), "zigzag", 1));
    let shard = read(&plan(dir.path(), "zigzag", 4));
    assert_eq!(whole.get("tp"), None, "TP 1 plans keep their old form");
    assert_eq!(shard["tp"], 4);
    assert_eq!(
        (shard["q_heads"].as_u64(), shard["kv_heads"].as_u64()),
        (Some(16), Some(2))
    );
    // The same layout and the same tokens moving; each is a quarter of the bytes
    // (`simulate_reads_the_plans_tp_and_prices_its_collectives`).
    assert_eq!(shard["ranks"], whole["ranks"]);
    assert_eq!(shard["transfers"], whole["transfers"]);
}

#[test]
fn simulate_reads_the_plans_tp_and_prices_its_collectives() {
    let dir = tempfile::tempdir().unwrap();
    let whole = plan(dir.path(), "zigzag", 1);
    let shard = plan(dir.path(), "zigzag", 4);
    let w = simulate_json(&["--layer"], &whole);
    let s = simulate_json(&["--layer"], &shard);
    assert_eq!(w.get("tp"), None);
    assert_eq!(w.get("tp_comm_max_ms"), None);
    assert_eq!(s["tp"], 4);
    let tp_ms = s["tp_comm_max_ms"].as_f64().unwrap();
    assert!(tp_ms > 0.0);
    // A quarter of the K/V per GPU, a quarter of the GEMM work.
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    let kv = |v: &Value| v["comm_bytes_total"].as_u64().unwrap();
    assert_eq!(kv(&w), 4 * kv(&s));
    assert!((f(&w, "linear_mean_ms") / f(&s, "linear_mean_ms") - 4.0).abs() < 1e-3);
    // The layer holds the collectives: more than its GEMMs and attention's share alone.
    assert!(f(&s, "layer_time_ms") > f(&s, "linear_max_ms") + tp_ms);
    for r in s["ranks"].as_array().unwrap() {
        assert!(r["tp_comm_ms"].as_f64().unwrap() <= tp_ms);
    }
    // The table says so too.
    fcp()
        .args(["simulate", "--layer"])
        .arg(&shard)
        .assert()
        .success()
        .stdout(
            predicate::str::contains("llama3-70b · TP 4 · pass both")
                .and(predicate::str::contains(
                    "tensor parallel: TP 4 · collectives",
                ))
                .and(predicate::str::contains("tp_ms")),
        );
}

#[test]
fn overlapping_tp_collectives_hides_part_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let shard = plan(dir.path(), "zigzag", 8);
    let exposed = simulate_json(&["--layer"], &shard);
    let hidden = simulate_json(&["--layer", "--tp-overlap"], &shard);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    assert_eq!(exposed.get("tp_overlap"), None);
    assert_eq!(hidden["tp_overlap"], true);
    assert!(f(&hidden, "tp_comm_max_ms") < f(&exposed, "tp_comm_max_ms"));
    assert!(f(&hidden, "layer_time_ms") < f(&exposed, "layer_time_ms"));
    // Attention is the plan's either way.
    assert_eq!(hidden["attention_time_ms"], exposed["attention_time_ms"]);
    // Only with the layer.
    fcp()
        .args(["simulate", "--tp-overlap"])
        .arg(&shard)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--layer"));
}

#[test]
fn a_tp_the_node_or_model_cannot_take_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    for (tp, why) in [
        ("3", "does not divide the 8 GPUs per node of h100"),
        ("16", "does not divide the 8 GPUs per node of h100"),
        ("0", "must be 1 to 1024"),
    ] {
        fcp()
            .args(["plan", "--scheme", "ring", "--ranks", "4", "--tp", tp, "-o"])
            .arg(&out)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(why));
        assert!(!out.exists(), "--tp {tp} wrote a plan");
    }
    // 16 heads split 8 ways: two per GPU.
    fcp()
        .args(["plan", "--scheme", "ring", "--ranks", "4", "--tp", "8"])
        .args(["--model", "mha-16", "-o"])
        .arg(&out)
        .assert()
        .success();
}

/// Regression (bug hunt): a plan's `tp` and its head counts must agree. An edited `tp`
/// drew advice to plan again with the same `--model`, and `verify` passed a `tp` of 0 or
/// 99999; `simulate --tp N` could only repeat the plan's split, and was dropped.
#[test]
fn a_plan_whose_tp_does_not_match_its_heads_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let shard = plan(dir.path(), "ring", 2);
    let text = std::fs::read_to_string(&shard).unwrap();
    let edited = |to: &str| {
        let p = dir.path().join(format!("edited-{to}.json"));
        assert!(text.contains("\"tp\":2"));
        std::fs::write(&p, text.replace("\"tp\":2", &format!("\"tp\":{to}"))).unwrap();
        p
    };
    fcp()
        .arg("simulate")
        .arg(edited("1"))
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains(
                "model llama3-70b's split 2 ways, but records tensor parallelism 1",
            )
            .and(predicate::str::contains("plan again with --tp 2")),
        );
    fcp()
        .arg("simulate")
        .arg(edited("4"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("plan again with --tp 2"));
    for bad in ["0", "99999"] {
        fcp()
            .arg("verify")
            .arg(edited(bad))
            .assert()
            .failure()
            .stdout(predicate::str::contains(format!(
                "tp {bad}: the tensor-parallel degree is 1 to 1024"
            )));
    }
    fcp()
        .args(["simulate", "--tp", "2"])
        .arg(&shard)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unexpected argument '--tp'"));
}

#[test]
fn compare_under_tp_names_it_in_every_format() {
    let run = |extra: &[&str]| {
        stdout_of(
            fcp()
                .args([
                    "compare",
                    "--ranks",
                    "4",
                    "--tokens-per-rank",
                    "8192",
                    "--tp",
                    "2",
                ])
                .args(["--schemes", "ring,zigzag,fcp", "--batches", "1"])
                .args(extra),
        )
    };
    let table = run(&["--layer"]);
    assert!(
        table.contains("h100 / llama3-70b · TP 2 · causal"),
        "{table}"
    );
    assert!(table.lines().nth(1).unwrap().ends_with("tp_ms"), "{table}");
    let rows: Value = serde_json::from_str(&run(&["--json"])).unwrap();
    for r in rows.as_array().unwrap() {
        assert_eq!(r["tp"], 2, "{r}");
    }
    let csv = run(&["--csv", "--layer"]);
    let header = csv.lines().next().unwrap();
    assert!(header.ends_with(",tp_comm_max_ms,tp"), "{header}");
    assert!(csv.lines().nth(1).unwrap().ends_with(",2"), "{csv}");
    // Without TP neither column, nor the key.
    let plain = stdout_of(
        fcp()
            .args(["compare", "--ranks", "4", "--tokens-per-rank", "8192"])
            .args(["--schemes", "ring", "--batches", "1", "--csv", "--layer"]),
    );
    assert!(
        plain.lines().next().unwrap().ends_with(",act_max_bytes"),
        "{plain}"
    );
}

/// Regression (bug hunt): `--tp-overlap` without TP changes nothing, and says so.
#[test]
fn tp_overlap_without_tp_says_it_changes_nothing() {
    fcp()
        .args([
            "compare",
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
            "--layer",
        ])
        .args(["--tp-overlap", "--schemes", "ring", "--batches", "1"])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "--tp-overlap changes nothing without tensor parallelism",
        ));
}

#[test]
fn a_sweep_under_tp_tags_its_cells() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("s.toml");
    let grid = "[grid]\ntraces = [\"gen:lognormal:seed=1\"]\nschemes = [\"zigzag\"]\nranks = [4]\ntokens_per_rank = [8192]\n";
    std::fs::write(&cfg, format!("batches = 1\nlayer = true\ntp = 4\n{grid}")).unwrap();
    let out = dir.path().join("out");
    fcp()
        .arg("sweep")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let cells: Vec<_> = std::fs::read_dir(out.join("cells")).unwrap().collect();
    assert_eq!(cells.len(), 1);
    let cell = std::fs::read_to_string(cells[0].as_ref().unwrap().path()).unwrap();
    assert!(cell.contains(";layer=true;tp=4"), "{cell}");
    // Regression (bug hunt): the TP collectives are a sweep metric too.
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().ends_with(",tp_comm_max_ms_max"),
        "{csv}"
    );
    for (config, why) in [
        // Regression (bug hunt): overlap at TP 1 changed no number but renamed every cell.
        ("layer = true\ntp_overlap = true\n", "it needs tp > 1"),
        ("tp = 2\ntp_overlap = true\n", "it needs layer = true"),
        ("tp = 5\n", "tensor-parallel degree 5"),
    ] {
        std::fs::write(&cfg, format!("{config}{grid}")).unwrap();
        fcp()
            .arg("sweep")
            .arg(&cfg)
            .arg("-o")
            .arg(dir.path().join("refused"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains(why));
    }
}

/// `fcp tpcp` on 8 GPUs of one 16K window: the small study these tests run.
const TPCP_8: [&str; 7] = [
    "tpcp",
    "--gpus",
    "8",
    "--context",
    "16384",
    "--batches",
    "1",
];

/// `fcp tpcp` tries every TP that divides the GPUs and fits a node, on the same windows, and
/// names the fastest split; its numbers are `compare --tp`'s.
#[test]
fn tpcp_splits_the_gpus_and_matches_compare() {
    let args: Vec<&str> = TPCP_8
        .into_iter()
        .chain([
            "--schemes",
            "zigzag,hybrid:quick=true",
            // Gradients and optimizer state sharded over 64 replicas: the 70B model's state fits
            // at TP 8 (memory does not change the times).
            "--zero",
            "2",
            "--dp",
            "64",
        ])
        .collect();
    let out = stdout_of(fcp().args(&args).arg("--json"));
    let rows: Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    let splits: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (r["tp"].as_u64().unwrap(), r["cp"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        splits,
        [
            (8, 1),
            (8, 1),
            (4, 2),
            (4, 2),
            (2, 4),
            (2, 4),
            (1, 8),
            (1, 8)
        ]
    );
    // TP 4 × CP 2 is `compare --ranks 2 --tp 4` on the same window.
    let cmp = stdout_of(
        fcp()
            .args(["compare", "--ranks", "2", "--tp", "4", "--pack", "window"])
            .args([
                "--context",
                "16384",
                "--batches",
                "1",
                "--schemes",
                "zigzag",
            ])
            .args(["--layer", "--json"]),
    );
    let cmp: Value = serde_json::from_str(&cmp).unwrap();
    assert_eq!(rows[2]["layer_time_ms"], cmp[0]["layer_time_ms"]);
    assert_eq!(rows[2]["attention_time_ms"], cmp[0]["attention_time_ms"]);
    // The table and its verdict; the same output twice.
    let table = || stdout_of(fcp().args(&args));
    let t = table();
    assert!(
        t.contains("Fastest layer that fits in memory: ")
            && t.contains("Each scheme's best split: zigzag TP"),
        "{t}"
    );
    assert_eq!(t, table());
}

#[test]
fn tpcp_refuses_what_it_cannot_price() {
    fcp()
        .args(["tpcp", "--gpus", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--gpus must be at least 1"));
    // TP is priced in the whole layer: a model without its widths cannot say.
    fcp()
        .args(["tpcp", "--gpus", "8", "--model", "mha-16", "--batches", "1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("hidden"));
    // A split the model cannot take is a row that says why, not a failure.
    let out = stdout_of(
        fcp()
            .args([
                "tpcp",
                "--gpus",
                "6",
                "--context",
                "12288",
                "--batches",
                "1",
            ])
            .args(["--schemes", "zigzag"]),
    );
    assert!(
        out.contains("cannot run: tensor-parallel degree 6"),
        "{out}"
    );
    assert!(
        out.contains("cannot run: tensor-parallel degree 3"),
        "{out}"
    );
}

/// Regression (bug hunt): `tpcp --json` exited 0 when no split could run (the table exited
/// 2, as `compare` does); a scheme that ran nowhere vanished from the summary; and overlap
/// that changed nothing was announced.
#[test]
fn tpcp_says_what_did_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.toml");
    std::fs::write(
        &odd,
        "name = \"odd\"\nq_heads = 7\nkv_heads = 7\nhead_dim = 128\ndtype_bytes = 2\nhidden = 896\nffn_hidden = 3584\n",
    )
    .unwrap();
    let base = TPCP_8;
    for json in [false, true] {
        let mut c = fcp();
        c.args(base)
            .arg("--model")
            .arg(&odd)
            .args(["--schemes", "ulysses"]);
        if json {
            c.arg("--json");
        }
        c.assert()
            .code(2)
            .stderr(predicate::str::contains("no split could run any scheme"));
    }
    // Regression (bug hunt): only the first split's reason was given (TP 6's node domain),
    // when TP 2 × CP 3 and TP 1 × CP 6 failed on Ulysses' head count.
    fcp()
        .args([
            "tpcp",
            "--gpus",
            "6",
            "--context",
            "6000",
            "--schemes",
            "ulysses",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "  TP 6 × CP 1: tensor-parallel degree 6",
        ))
        .stderr(predicate::str::contains(
            "  TP 1 × CP 6 ulysses: batch 0: ulysses needs q_heads (64) divisible by N (6)",
        ));
    let out = stdout_of(
        fcp()
            .args(base)
            .arg("--model")
            .arg(&odd)
            .args(["--schemes", "ulysses,zigzag"]),
    );
    assert!(
        out.contains("ulysses ran at no split; zigzag TP 1 × CP 8"),
        "{out}"
    );
    fcp()
        .args(["tpcp", "--gpus", "1", "--context", "8192", "--batches", "1"])
        .args(["--schemes", "zigzag", "--tp-overlap"])
        .assert()
        .success()
        .stdout(predicate::str::contains("overlapped").not())
        .stderr(predicate::str::contains("--tp-overlap changes nothing"));
}

/// Overlap shows in `compare`'s header and CSV, so two runs differ in more than numbers.
#[test]
fn compare_names_tp_overlap() {
    let run = |csv: bool| {
        let mut c = fcp();
        c.args([
            "compare",
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
            "--tp",
            "2",
        ])
        .args([
            "--layer",
            "--tp-overlap",
            "--schemes",
            "zigzag",
            "--batches",
            "1",
        ]);
        if csv {
            c.arg("--csv");
        }
        stdout_of(&mut c)
    };
    assert!(run(false)
        .lines()
        .next()
        .unwrap()
        .ends_with("pass both · TP collectives overlapped"));
    let csv = run(true);
    assert!(
        csv.lines().next().unwrap().ends_with(",tp,tp_overlap"),
        "{csv}"
    );
    assert!(csv.lines().nth(1).unwrap().ends_with(",2,true"), "{csv}");
}

/// `fcp tpcp --pack wlb` gives every split the same WLB micro-batches (the group from the
/// step, the breakpoint from the model) and its numbers are `compare --pack wlb --tp`'s;
/// packings that are not windows, and `--wlb-*` without `--pack wlb`, are refused.
#[test]
fn tpcp_packs_wlb_as_compare_does() {
    let tpcp = [
        "tpcp",
        "--gpus",
        "8",
        "--context",
        "16384",
        "--batches",
        "4",
        "--schemes",
        "zigzag",
        "--zero",
        "2",
        "--dp",
        "64",
        "--pack",
        "wlb",
        "--wlb-outlier",
        "4096",
    ];
    let rows: Value = serde_json::from_str(&stdout_of(fcp().args(tpcp).arg("--json"))).unwrap();
    // TP 4 × CP 2 is `compare --ranks 2 --tp 4` on the same micro-batches.
    let cmp = stdout_of(
        fcp()
            .args(["compare", "--ranks", "2", "--tp", "4", "--pack", "wlb"])
            .args([
                "--context",
                "16384",
                "--wlb-outlier",
                "4096",
                "--wlb-group",
                "8",
            ])
            .args(["--batches", "4", "--schemes", "zigzag", "--layer", "--json"]),
    );
    let cmp: Value = serde_json::from_str(&cmp).unwrap();
    let row = &rows.as_array().unwrap()[1];
    assert_eq!((row["tp"].as_u64(), row["cp"].as_u64()), (Some(4), Some(2)));
    assert_eq!(row["layer_time_ms"], cmp[0]["layer_time_ms"]);
    assert_eq!(row["attention_time_ms"], cmp[0]["attention_time_ms"]);
    // Not the windows': WLB's micro-batches differ.
    let window: Value = serde_json::from_str(&stdout_of(
        fcp().args(&tpcp[..tpcp.len() - 4]).arg("--json"),
    ))
    .unwrap();
    assert_ne!(window[1]["layer_time_ms"], row["layer_time_ms"]);
    assert!(stdout_of(fcp().args(tpcp)).contains(
        "8 GPUs per WLB micro-batch (at most 32768 tokens; 8 a step, from 16384-token windows)"
    ));
    // Priced steps that are not WLB's are said, as `compare` says them.
    let err = String::from_utf8(
        fcp()
            .args(tpcp)
            .args(["--micro-batches", "4", "--wlb-group", "8"])
            .assert()
            .success()
            .get_output()
            .stderr
            .clone(),
    )
    .unwrap();
    assert!(err.contains("they are not WLB's steps"), "{err}");
    for (extra, says) in [
        (
            // Regression (bug hunt): `--help` listed budget and carry, refused only later.
            &["--pack", "budget"][..],
            "[possible values: window, wlb]",
        ),
        (
            &["--wlb-group", "4"][..],
            "--wlb-group applies only to --pack wlb",
        ),
    ] {
        fcp()
            .args(TPCP_8)
            .args(extra)
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(says));
    }
}

/// Regression (bug hunt): a scheme that ran at no split (ulysses: 32 heads do not divide 5
/// ranks) was said to "fit at none of the splits it ran at", as if memory were the reason.
#[test]
fn regression_a_scheme_that_ran_nowhere_is_not_said_to_miss_memory() {
    let text = stdout_of(
        fcp()
            .args([
                "tpcp",
                "--gpus",
                "5",
                "--model",
                "llama3-8b",
                "--context",
                "8192",
            ])
            .args(["--batches", "1", "--schemes", "ulysses,zigzag"]),
    );
    assert!(text.contains("ulysses ran at no split"), "{text}");
    assert!(!text.contains("ulysses fits at none"), "{text}");
}
