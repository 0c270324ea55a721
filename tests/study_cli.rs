//! End-to-end: `fcp sweep` (determinism, resumability after SIGINT) and `fcp regress`.

mod support;

use std::path::Path;
use std::time::Duration;
use support::{fcp, stdout_of};

use predicates::prelude::*;
use serde_json::Value;

const TINY: &str = r#"
name = "tiny"
batches = 3
[grid]
traces = ["default", "gen:exponential:mean=2048,max=16384,seed=7"]
schemes = ["zigzag", "fcp", "magi", "flashcp-not-yet"]
ranks = [2, 4]
tokens_per_rank = [8192]
"#;

fn sweep(cfg: &Path, out: &Path, threads: &str) {
    fcp()
        .arg("sweep")
        .arg(cfg)
        .arg("-o")
        .arg(out)
        .env("RAYON_NUM_THREADS", threads)
        .assert()
        .success();
}

#[test]
fn sweep_results_are_identical_whatever_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tiny.toml");
    std::fs::write(&cfg, TINY).unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    sweep(&cfg, &a, "1");
    sweep(&cfg, &b, "2");
    for f in ["results.csv", "results.json"] {
        let x = std::fs::read(a.join(f)).unwrap();
        assert_eq!(x, std::fs::read(b.join(f)).unwrap(), "{f} differs");
    }
    let rows: Value =
        serde_json::from_slice(&std::fs::read(a.join("results.json")).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 16);
    // The scheme that has not landed keeps its rows, with the reason.
    let missing: Vec<_> = rows
        .iter()
        .filter(|r| r["scheme"] == "flashcp-not-yet")
        .collect();
    assert_eq!(missing.len(), 4);
    assert!(missing[0]["error"]
        .as_str()
        .unwrap()
        .contains("unknown scheme"));
    let ok = &rows[0]["metrics"]["compute_imbalance"];
    for s in ["mean", "p50", "p95", "max"] {
        assert!(ok[s].is_number(), "{ok}");
    }
    let csv = std::fs::read_to_string(a.join("results.csv")).unwrap();
    assert!(csv
        .lines()
        .next()
        .unwrap()
        .contains("attention_time_ms_mean,attention_time_ms_p50,attention_time_ms_p95"));
}

#[test]
fn interrupted_sweep_keeps_finished_cells_and_a_rerun_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("slow.toml");
    // Fast cells first, then one that takes seconds on one thread (zigzag on 32 ranks),
    // during which the sweep is interrupted.
    std::fs::write(
        &cfg,
        r#"
batches = 2
[grid]
traces = ["default"]
schemes = ["magi", "fcp", "zigzag"]
ranks = [8, 32]
tokens_per_rank = [32768]
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let bin = assert_cmd::cargo::cargo_bin("fcp");
    let mut child = std::process::Command::new(&bin)
        .arg("sweep")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .args(["--threads", "1", "--quiet"])
        .spawn()
        .unwrap();
    let cells = out.join("cells");
    let count = |d: &Path| {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .count()
            })
            .unwrap_or(0)
    };
    let interrupted = support::interrupt_when(
        &mut child,
        || count(&cells) >= 4,
        Duration::from_millis(20),
        Duration::from_secs(120),
    );
    let _ = child.wait();
    // Every file left is complete JSON; the merged results are absent or complete.
    let mut finished = 0;
    for e in std::fs::read_dir(&cells).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".json") {
            let v: Value = serde_json::from_slice(&std::fs::read(e.path()).unwrap())
                .unwrap_or_else(|err| panic!("{name} is corrupt: {err}"));
            assert!(v["scheme"].is_string());
            finished += 1;
        }
    }
    eprintln!("interrupted: {interrupted}, finished cells: {finished}");
    // The signal can land after the last cell (a loaded machine runs the check late): then
    // the merged results may exist, but only whole.
    if interrupted {
        assert!(finished <= 6);
        let merged = out.join("results.json");
        if merged.exists() {
            let v: Value = serde_json::from_slice(&std::fs::read(&merged).unwrap())
                .expect("results.json is whole");
            assert_eq!(v.as_array().map(Vec::len), Some(6));
        }
    }
    // The rerun reuses the finished cells and completes the sweep.
    let o = fcp()
        .arg("sweep")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .assert()
        .success()
        .get_output()
        .stderr
        .clone();
    let msg = String::from_utf8_lossy(&o);
    assert!(msg.contains(&format!("{} reused", finished)), "{msg}");
    assert_eq!(count(&cells), 6);
    let rows: Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 6);
}

#[test]
fn regress_passes_on_its_baseline_and_names_a_worsened_cell() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("baseline.json");
    // Record a baseline with zigzag and fcp.
    let grid = r#"{"version":1,"tolerance":0.03,"grid":{"batches":2,"grid":{"traces":["default"],
        "schemes":["zigzag","fcp"],"ranks":[4],"tokens_per_rank":[8192]}},"cells":[]}"#;
    std::fs::write(&base, grid).unwrap();
    fcp()
        .args(["regress", "--update", "--baseline"])
        .arg(&base)
        .assert()
        .success();
    fcp()
        .args(["regress", "--baseline"])
        .arg(&base)
        .assert()
        .success()
        .stdout(predicate::str::contains("2 cells within tolerance"));

    // A deliberately worsened plan: the zigzag cell is now planned by ring (no load balance),
    // against zigzag's recorded numbers.
    let mut b: Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    b["grid"]["grid"]["schemes"] = serde_json::json!(["ring", "fcp"]);
    b["cells"][0]["scheme"] = "ring".into();
    let worse = dir.path().join("worse.json");
    std::fs::write(&worse, serde_json::to_vec_pretty(&b).unwrap()).unwrap();
    fcp()
        .args(["regress", "--baseline"])
        .arg(&worse)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "REGRESSED default · ring · 4 ranks",
        ))
        .stdout(predicate::str::contains("compute_imbalance"))
        .stdout(predicate::str::contains("fcp").not());

    // A recorded attention time 20% better than today's is a regression too, unless the
    // tolerance allows it.
    let mut b: Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    let t = b["cells"][1]["attention_time_ms"].as_f64().unwrap();
    b["cells"][1]["attention_time_ms"] = (t / 1.2).into();
    std::fs::write(&worse, serde_json::to_vec_pretty(&b).unwrap()).unwrap();
    fcp()
        .args(["regress", "--baseline"])
        .arg(&worse)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("REGRESSED default · fcp"))
        .stdout(predicate::str::contains("attention_time_ms"));
    fcp()
        .args(["regress", "--tolerance", "0.25", "--baseline"])
        .arg(&worse)
        .assert()
        .success();
}

#[test]
fn bad_sweep_configs_exit_2_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[0]\n",
    )
    .unwrap();
    fcp()
        .arg("sweep")
        .arg(&cfg)
        .args(["-o"])
        .arg(dir.path().join("o"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("grid.ranks"));
    fcp()
        .args(["regress", "--baseline"])
        .arg(dir.path().join("none.json"))
        .assert()
        .code(2);
    // Inputs that do not load leave no folder behind. Regression: an empty `o/cells/` was.
    for (grid, says) in [
        (
            "traces=[\"nope.csv\"]\nschemes=[\"ring\"]\nranks=[2]\n",
            "nope.csv",
        ),
        (
            "traces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]\nhardware=[\"tpu\"]\n",
            "tpu",
        ),
    ] {
        std::fs::write(&cfg, format!("[grid]\n{grid}")).unwrap();
        let out = dir.path().join("left");
        fcp()
            .arg("sweep")
            .arg(&cfg)
            .arg("-o")
            .arg(&out)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says));
        assert!(!out.exists(), "{grid}: {out:?} was created");
    }
}

#[test]
fn plots_are_written_as_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tiny.toml");
    std::fs::write(&cfg, TINY).unwrap();
    let out = dir.path().join("out");
    sweep(&cfg, &out, "2");
    let results = out.join("results.json");
    let png = |name: &str| {
        let p = dir.path().join(name);
        let b = std::fs::read(&p).unwrap();
        assert!(b.starts_with(b"\x89PNG") && b.len() > 5000, "{name}");
    };
    for (kind, name) in [("imbalance", "imb.png"), ("scaling", "mfu.png")] {
        fcp()
            .args(["plot", kind])
            .arg(&results)
            .args(["--filter", "trace=default", "-o"])
            .arg(dir.path().join(name))
            .assert()
            .success();
        png(name);
    }
    // Regression: a filter on a key that does not exist, or a value no row has, ended in a
    // message about missing values that did not name the filter.
    for (filter, says) in [
        ("nokey=1", "have no key `nokey` (keys: "),
        ("scheme=nope", "no row of"),
        ("scheme=nope", "(values: "),
    ] {
        fcp()
            .args(["plot", "imbalance"])
            .arg(&results)
            .args(["--filter", filter, "-o"])
            .arg(dir.path().join("never.png"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says));
        assert!(!dir.path().join("never.png").exists());
    }
    // Regression (bug hunt): a results file without rows blamed --filter when none was given.
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "[]").unwrap();
    for kind in [vec!["imbalance"], vec!["lines", "--x", "ranks"]] {
        fcp()
            .arg("plot")
            .args(&kind)
            .arg(&empty)
            .arg("-o")
            .arg(dir.path().join("never.svg"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("empty.json has no rows"))
            .stderr(predicate::str::contains("--filter").not());
        assert!(!dir.path().join("never.svg").exists());
    }
    fcp()
        .args(["plot", "lines"])
        .arg(&results)
        .args(["--x", "ranks", "--speedup-vs", "zigzag", "-o"])
        .arg(dir.path().join("speedup.svg"))
        .assert()
        .success();
    let svg = std::fs::read_to_string(dir.path().join("speedup.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("speedup over zigzag"));
    // Regression (bug hunt): a baseline no row ran ended in "no row has both a Ranks value
    // and mfu", a metric nobody asked for.
    for (args, says) in [
        (
            vec!["--speedup-vs", "nosuch"],
            "--speedup-vs nosuch: no row of",
        ),
        (
            vec!["--speedup-vs", "zigzag", "--filter", "scheme=magi"],
            "left by --filter ran zigzag (schemes there: magi)",
        ),
    ] {
        fcp()
            .args(["plot", "lines"])
            .arg(&results)
            .args(["--x", "ranks"])
            .args(args)
            .arg("-o")
            .arg(dir.path().join("never.svg"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says));
        assert!(!dir.path().join("never.svg").exists());
    }
    // Regression (bug hunt): two values of one key asked for a row of both schemes, matched
    // none, and were refused as "no row has both a `ranks` value and mfu". Values of one key
    // are alternatives now; keys no row satisfies together are named.
    let lines_by_ranks = |filters: [&str; 2], out: &Path| {
        let mut c = fcp();
        c.args(["plot", "lines"])
            .arg(&results)
            .args(["--x", "ranks"]);
        for f in filters {
            c.args(["--filter", f]);
        }
        c.arg("-o").arg(out).assert()
    };
    let two = dir.path().join("two.svg");
    lines_by_ranks(["scheme=zigzag", "scheme=magi"], &two).success();
    let svg = std::fs::read_to_string(&two).unwrap();
    assert!(svg.contains("zigzag") && svg.contains("magi") && !svg.contains("fcp"));
    lines_by_ranks(["scheme=zigzag", "ranks=3"], &dir.path().join("never.svg"))
        .code(2)
        .stderr(predicate::str::contains("ranks=3"));
    fcp()
        .args(["plot", "cdf", "default", "-o"])
        .arg(dir.path().join("cdf.png"))
        .assert()
        .success();
    png("cdf.png");
    let plan = dir.path().join("plan.json");
    fcp()
        .args(["plan", "--scheme", "zigzag", "--ranks", "4"])
        .args(["--tokens-per-rank", "8192", "-o"])
        .arg(&plan)
        .assert()
        .success();
    fcp()
        .args(["plot", "gantt"])
        .arg(&plan)
        .args(["-o"])
        .arg(dir.path().join("gantt.png"))
        .assert()
        .success();
    png("gantt.png");
    // The whole layer: the projections and MLP drawn and named in the legend (SVG text).
    fcp()
        .args(["plot", "gantt", "--layer"])
        .arg(&plan)
        .args(["-o"])
        .arg(dir.path().join("gantt-layer.svg"))
        .assert()
        .success();
    let svg = std::fs::read_to_string(dir.path().join("gantt-layer.svg")).unwrap();
    assert!(
        svg.contains("projections + MLP") && svg.contains("· layer "),
        "{svg:.300}"
    );
    let plain = std::fs::read_to_string({
        let p = dir.path().join("gantt.svg");
        fcp()
            .args(["plot", "gantt"])
            .arg(&plan)
            .arg("-o")
            .arg(&p)
            .assert()
            .success();
        p
    })
    .unwrap();
    assert!(!plain.contains("projections + MLP"));
    fcp()
        .args(["plot", "gantt"])
        .arg(&plan)
        .args(["-o"])
        .arg(dir.path().join("gantt.pdf"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(".png or .svg"));
}

#[test]
fn dpcp_reports_the_straggler_effect() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("dpcp.toml");
    std::fs::write(
        &cfg,
        "gpus = 16\ncp = [1, 4]\ntokens_per_gpu = 8192\nsteps = 3\ntrace = \"gen:exponential:mean=1024,max=8192\"\n",
    )
    .unwrap();
    let out = dir.path().join("o");
    fcp()
        .arg("dpcp")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("max/min"));
    let rows: Value =
        serde_json::from_slice(&std::fs::read(out.join("dpcp.json")).unwrap()).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 4);
    fcp()
        .args(["plot", "dpcp"])
        .arg(out.join("dpcp.json"))
        .arg("-o")
        .arg(dir.path().join("d.png"))
        .assert()
        .success();
}

/// `tp = 8`: each CP rank a TP group; the header and rows say so (and the plot that the times
/// are the whole layer's), and a group that does not divide the cluster is refused before
/// anything runs.
#[test]
fn dpcp_under_tensor_parallelism_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("dpcp.toml");
    let text = "gpus = 64\ncp = [1, 8]\ntokens_per_gpu = 4096\nsteps = 2\ntp = 8\nlayer = true\ntrace = \"gen:exponential:mean=1024,max=8192\"\n";
    std::fs::write(&cfg, text).unwrap();
    let rows: Value =
        serde_json::from_str(&stdout_of(fcp().arg("dpcp").arg(&cfg).arg("--json"))).unwrap();
    let groups: Vec<(u64, u64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["cp"].as_u64().unwrap(), r["groups"].as_u64().unwrap()))
        .collect();
    assert_eq!(groups, [(1, 8), (1, 8), (8, 1), (8, 1)]);
    assert!(rows[0]["tp"] == 8);
    let out = dir.path().join("o");
    fcp()
        .arg("dpcp")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("64 GPUs · TP 8 ·"));
    // Regression (bug hunt): a whole-layer study's plot said attention time.
    let svg = dir.path().join("d.svg");
    fcp()
        .args(["plot", "dpcp"])
        .arg(out.join("dpcp.json"))
        .arg("-o")
        .arg(&svg)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("whole-layer time") && !svg.contains("attention time"),
        "{svg}"
    );
    std::fs::write(&cfg, text.replace("cp = [1, 8]", "cp = [16]")).unwrap();
    fcp()
        .arg("dpcp")
        .arg(&cfg)
        .assert()
        .failure()
        .stdout("")
        .stderr(predicate::str::contains("cp 16 × tp 8 = 128 GPUs a group"));
}

/// `layer = true`: every cell gains the whole-layer metrics, in results.json and as CSV columns
/// after the others (and a layer metric can be plotted); without it, neither (and the cells
/// keep the names earlier sweeps gave them). A model without the layer's widths is refused.
#[test]
fn a_sweep_with_the_layer_reports_its_metrics_after_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let base = r#"
batches = 2
[grid]
traces = ["default"]
schemes = ["zigzag", "hybrid"]
ranks = [4]
tokens_per_rank = [8192]
"#;
    let plain_cfg = dir.path().join("plain.toml");
    std::fs::write(&plain_cfg, base).unwrap();
    let layer_cfg = dir.path().join("layer.toml");
    std::fs::write(&layer_cfg, format!("layer = true\n{base}")).unwrap();
    let (plain, layer) = (dir.path().join("p"), dir.path().join("l"));
    sweep(&plain_cfg, &plain, "2");
    sweep(&layer_cfg, &layer, "2");
    let header = |d: &Path| {
        std::fs::read_to_string(d.join("results.csv"))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    assert!(!header(&plain).contains("layer_time_ms"));
    assert!(header(&layer).starts_with(&header(&plain)));
    assert!(header(&layer).contains(",layer_time_ms_mean,"));
    let rows: Value =
        serde_json::from_slice(&std::fs::read(layer.join("results.json")).unwrap()).unwrap();
    for r in rows.as_array().unwrap() {
        let m = &r["metrics"];
        assert!(
            m["layer_time_ms"]["mean"].as_f64().unwrap()
                > m["attention_time_ms"]["mean"].as_f64().unwrap()
        );
        assert!(m["token_imbalance"]["max"].is_number());
    }
    // The same cells, with and without the layer, are different cells.
    let names = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d.join("cells"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_ne!(names(&plain), names(&layer));
    let png = dir.path().join("layer.png");
    fcp()
        .args(["plot", "imbalance"])
        .arg(layer.join("results.json"))
        .args(["--metric", "layer_time_ms", "-o"])
        .arg(&png)
        .assert()
        .success();
    assert!(png.exists());
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("layer = true\n{base}model = [\"mha-16\"]\n")).unwrap();
    fcp()
        .arg("sweep")
        .arg(&bad)
        .arg("-o")
        .arg(dir.path().join("bad"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("mha-16 gives no `hidden`"));
}

/// Regression (bug hunt): `grid.pass` edited to "fwd" in a baseline without `--update`
/// compared forward numbers with the recorded training ones and passed ("44 improvements").
#[test]
fn regress_fails_a_baseline_whose_settings_were_edited_without_update() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("baseline.json");
    let grid = r#"{"version":1,"tolerance":0.03,"grid":{"batches":1,"grid":{"traces":["default"],
        "schemes":["zigzag"],"ranks":[2],"tokens_per_rank":[4096]}},"cells":[]}"#;
    std::fs::write(&base, grid).unwrap();
    fcp()
        .args(["regress", "--update", "--baseline"])
        .arg(&base)
        .assert()
        .success();
    let mut v: Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    assert_eq!(v["settings"], "batches=1;pass=both;mask=causal;pack=budget");
    fcp()
        .args(["regress", "--baseline"])
        .arg(&base)
        .assert()
        .success();
    v["grid"]["pass"] = "fwd".into();
    std::fs::write(&base, serde_json::to_string(&v).unwrap()).unwrap();
    fcp()
        .args(["regress", "--baseline"])
        .arg(&base)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("recorded under other settings"));
}

/// Regression (bug hunt): a sweep cell on a generated trace (`gen:...`) could not be rerun
/// with `compare`, which read only files. `--trace gen:...` generates it as the sweep does,
/// so the cell's batches and figures are the comparison's.
#[test]
fn compare_reruns_a_sweep_cell_on_a_generated_trace() {
    let spec = "gen:exponential:mean=2048,max=16384,seed=3";
    let results = support::sweep_results(&format!(
        "batches = 3\n[grid]\ntraces = [\"{spec}\"]\nschemes = [\"fcp\"]\nranks = [4]\ntokens_per_rank = [8192]\n"
    ));
    let cell = &results[0];
    assert!(cell["error"].is_null(), "{cell}");
    let out = fcp()
        .args([
            "compare",
            "--schemes",
            "fcp",
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
        ])
        .args(["--batches", "3", "--json", "--trace", spec])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = rows[0]["attention_time_ms"].as_f64().unwrap();
    let s = cell["metrics"]["attention_time_ms"]["mean"]
        .as_f64()
        .unwrap();
    assert!((c - s).abs() <= 1e-9 * c, "compare {c} vs sweep {s}");
    // A bad spec is a clear error, not a missing file.
    fcp()
        .args([
            "compare",
            "--ranks",
            "4",
            "--trace",
            "gen:exponential:docs=5",
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("exponential needs mean="));
}

/// Regression (bug hunt): when the kernel table had no series for the model (head dim 64 under
/// both passes: H100's table measures no causal backward at 64), `fcp dpcp`'s ideal cost fell
/// back to len² read as milliseconds and printed hours a step with exit 0; `cost = "sim"`
/// and `compare` refused the same model. It is now refused alike, naming the missing row.
#[test]
fn regression_dpcp_ideal_cost_refuses_a_model_the_table_cannot_price() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hd64.toml");
    std::fs::write(
        &cfg,
        "gpus = 8\ncp = [1, 8]\nsteps = 2\ntokens_per_gpu = 4096\ntrace = \"gen:exponential:mean=1024,max=8192,seed=1\"\nmodel = \"mha-16:head_dim=64\"\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    fcp()
        .arg("dpcp")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "kernel profile h100-fa3 has no row for bwd causal hd 64",
        ));
    assert!(!out.exists());
    // The forward pass alone is measured at head dim 64, and prices as it did.
    let fwd = dir.path().join("fwd.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&fwd, format!("{text}pass = \"fwd\"\n")).unwrap();
    let rows = support::json(fcp().arg("dpcp").arg(&fwd).arg("--json"));
    for r in rows.as_array().unwrap() {
        let ms = r["step_time_ms"].as_f64().unwrap();
        assert!(ms > 0.0 && ms < 100.0, "{r}");
    }
}

/// Regression (bug hunt): `fcp dpcp` priced every data-parallel group as if it started on a
/// node boundary, so CP 6 on 8-GPU nodes (its second group on GPUs 6 to 11) never paid a
/// NIC: with the NIC 94× slower its step did not move. A straddling group now pays the NICs
/// between its parts, and the note names the CP degrees whose groups straddle.
#[test]
fn regression_dpcp_says_when_groups_straddle_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |cp: &str| {
        let path = dir.path().join(format!("d{}.toml", cp.len()));
        std::fs::write(
            &path,
            format!(
                "gpus = 24\ncp = [{cp}]\ntokens_per_gpu = 2048\nsteps = 1\ntrace = \"gen:exponential:mean=512,max=4096,seed=1\"\nbalance = [\"none\"]\ncost = \"sim\"\nscheme = \"zigzag\"\nmodel = \"llama3-8b\"\n"
            ),
        )
        .unwrap();
        path
    };
    let note = |path: &std::path::Path| {
        let out = fcp()
            .arg("dpcp")
            .arg(path)
            .assert()
            .success()
            .get_output()
            .clone();
        String::from_utf8(out.stderr).unwrap()
    };
    let straddling = note(&cfg("6, 8, 12"));
    assert!(
        straddling.contains(
            "note: at CP 6, 12 some data-parallel groups straddle two nodes (8 GPUs a node): their traffic between the two pays the NICs"
        ),
        "{straddling}"
    );
    // Groups that divide a node or are whole nodes (24 = 3 nodes) start on a node's edge.
    let aligned = note(&cfg("4, 8, 24"));
    assert!(!aligned.contains("straddle"), "{aligned}");
    // With a NIC 100× slower, CP 6's step slows (its straddling groups cross it), CP 8's,
    // one node a group, does not.
    let slow = dir.path().join("slow-nic.toml");
    let h100 = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/hardware/h100.toml"),
    )
    .unwrap();
    assert!(h100.contains("nic_gbs = 47.0"));
    std::fs::write(&slow, h100.replace("nic_gbs = 47.0", "nic_gbs = 0.47")).unwrap();
    let step = |hw: &str| -> Vec<f64> {
        let path = cfg("6, 8");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}hardware = \"{hw}\"\n")).unwrap();
        let rows = support::json(fcp().arg("dpcp").arg(&path).arg("--json"));
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["step_time_ms"].as_f64().unwrap())
            .collect()
    };
    let (fast, slow) = (step("h100"), step(slow.to_str().unwrap()));
    assert!(slow[0] > 10.0 * fast[0], "CP 6: {fast:?} {slow:?}");
    assert!(
        (slow[1] - fast[1]).abs() < 1e-9 * fast[1],
        "CP 8: {fast:?} {slow:?}"
    );
}
