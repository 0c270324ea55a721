//! End-to-end: `fcp simulate`, `fcp compare`, `fcp hw overlap-bandwidth`.

mod support;

use std::path::{Path, PathBuf};
use support::{fcp, json};

use predicates::prelude::*;
use serde_json::Value;

fn plan(dir: &Path, scheme: &str, ranks: u32) -> PathBuf {
    let out = dir.join(format!("{scheme}-{ranks}.json"));
    fcp()
        .args(["plan", "--scheme", scheme, "--ranks", &ranks.to_string()])
        .args(["--tokens-per-rank", "8192", "-o"])
        .arg(&out)
        .assert()
        .success();
    out
}

const PLAN_KEYS: &[&str] = &[
    "attention_time_ms",
    "mem_max_bytes",
    "compute_imbalance",
    "comm_imbalance",
    "max_over_mean",
    "comm_bytes_total",
    "mfu",
    "lower_bound_ms",
    "vs_lower_bound",
];
const RANK_KEYS: &[&str] = &[
    "rank",
    "compute_ms",
    "comm_ms",
    "exposed_comm_ms",
    "waiting_on_peers_ms",
    "idle_ms",
    "flops",
    "bytes_sent",
    "bytes_recv",
    "tokens",
    "mem_bytes",
];

#[test]
fn simulate_json_has_every_metric_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), "zigzag", 4);
    let run = || {
        fcp()
            .args(["simulate", "--json"])
            .arg(&p)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone()
    };
    let a = run();
    assert_eq!(a, run(), "same plan, same bytes");
    let v: Value = serde_json::from_slice(&a).unwrap();
    for k in PLAN_KEYS {
        assert!(v[k].is_number(), "missing {k}");
    }
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    for k in RANK_KEYS {
        assert!(ranks[0][k].is_number(), "missing rank key {k}");
    }
    assert!(v["vs_lower_bound"].as_f64().unwrap() >= 1.0);
}

#[test]
fn inference_is_cheaper_than_training() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), "ring", 4);
    let t = |pass: &str| {
        json(fcp().args(["simulate", "--json", "--pass", pass]).arg(&p))["attention_time_ms"]
            .as_f64()
            .unwrap()
    };
    let (f, b, both) = (t("fwd"), t("bwd"), t("both"));
    assert!(f < b && b < both, "{f} {b} {both}");
    assert!((f + b - both).abs() < 1e-9);
}

#[test]
fn compare_all_lists_every_scheme_with_a_speedup() {
    let rows = json(fcp().args([
        "compare",
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--schemes",
        "all",
        "--batches",
        "2",
        "--json",
    ]));
    let rows = rows.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["scheme"].as_str().unwrap()).collect();
    for s in fcp::planners::SCHEMES {
        assert!(names.contains(s), "{s} missing from {names:?}");
    }
    for r in rows {
        for k in PLAN_KEYS {
            assert!(r[k].is_number(), "{}: missing {k}", r["scheme"]);
        }
        assert!(r["speedup"].is_number());
    }
    assert_eq!(rows[0]["speedup"].as_f64(), Some(1.0));
}

#[test]
fn compare_keeps_parameters_with_their_scheme_and_writes_csv() {
    let out = fcp()
        .args([
            "compare",
            "--ranks",
            "2",
            "--tokens-per-rank",
            "4096",
            "--batches",
            "1",
        ])
        .args(["--schemes", "zigzag,ring", "--baseline", "ring", "--csv"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("scheme,batches,attention_time_ms"));
    assert_eq!(lines.len(), 3);
    assert!(lines[2].starts_with("\"ring\",1,"));
}

#[test]
fn bad_simulation_inputs_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), "ring", 2);
    fcp()
        .args(["simulate", "--hardware", "tpu9"])
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown hardware"));
    fcp()
        .args(["simulate", "--model", "mha-16"])
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("plan again with --model"));
    // A model whose head dimension the kernel profile has no row for.
    let odd = dir.path().join("odd.toml");
    std::fs::write(
        &odd,
        "name = \"odd\"\nq_heads = 64\nkv_heads = 8\nhead_dim = 96\ndtype_bytes = 2\n",
    )
    .unwrap();
    let p96 = dir.path().join("p96.json");
    fcp()
        .args([
            "plan",
            "--scheme",
            "ring",
            "--ranks",
            "2",
            "--tokens-per-rank",
            "4096",
            "--model",
        ])
        .arg(&odd)
        .arg("-o")
        .arg(&p96)
        .assert()
        .success();
    fcp()
        .args(["simulate", "--model"])
        .arg(&odd)
        .arg(&p96)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no row"));
    // A corrupt plan: structurally invalid.
    let mut bad = fcp::Plan::load(&p).unwrap();
    bad.ranks[0].steps[0].tasks.clear();
    bad.save(&p).unwrap();
    fcp()
        .arg("simulate")
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a valid plan"));
    fcp()
        .args(["compare", "--ranks", "2", "--schemes", "ring,warp"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown scheme `warp`"));
}

/// Regression: `simulate` used to default to h100 / llama3-70b whatever the plan was made for,
/// so a B200 plan was simulated on an H100 without a word and a llama3-8b plan was refused.
#[test]
fn simulate_defaults_to_the_profiles_the_plan_was_made_for() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b200-8b.json");
    fcp()
        .args([
            "plan",
            "--scheme",
            "fcp",
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
        ])
        .args(["--hardware", "b200", "--model", "llama3-8b", "-o"])
        .arg(&p)
        .assert()
        .success();
    let time = |v: &Value| v["attention_time_ms"].as_f64().unwrap();
    let default = fcp()
        .args(["simulate", "--json"])
        .arg(&p)
        .assert()
        .success()
        .stderr(predicate::str::is_empty())
        .get_output()
        .stdout
        .clone();
    let default: Value = serde_json::from_slice(&default).unwrap();
    let named = json(
        fcp()
            .args([
                "simulate",
                "--json",
                "--hardware",
                "b200",
                "--model",
                "llama3-8b",
            ])
            .arg(&p),
    );
    assert_eq!(default["hardware"], "b200");
    assert_eq!(default["model"], "llama3-8b");
    assert_eq!(time(&default), time(&named));
    // Asking for another profile is honoured, with a note naming what the plan was made for.
    let h100 = fcp()
        .args(["simulate", "--json", "--hardware", "h100"])
        .arg(&p)
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "the plan was made for hardware `b200`; using `h100`",
        ))
        .get_output()
        .stdout
        .clone();
    let h100: Value = serde_json::from_slice(&h100).unwrap();
    assert_eq!(h100["hardware"], "h100");
    assert_ne!(time(&h100), time(&default), "another GPU, another time");
    // A plan made with a profile file names a profile that cannot be found without the file.
    let lab = dir.path().join("lab.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/hardware/h100.toml"
    ))
    .unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("name =") {
                "name = \"lab\"".to_string()
            } else if l.starts_with("kernel_profile =") {
                "kernel_profile = \"h100-fa3\"".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&lab, text).unwrap();
    let pl = dir.path().join("lab.json");
    fcp()
        .args([
            "plan",
            "--scheme",
            "ring",
            "--ranks",
            "2",
            "--tokens-per-rank",
            "4096",
        ])
        .arg("--hardware")
        .arg(&lab)
        .arg("-o")
        .arg(&pl)
        .assert()
        .success();
    fcp()
        .arg("simulate")
        .arg(&pl)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "made for hardware `lab` read from the file {}, not a bundled profile: pass --hardware {} again\n",
            lab.display(),
            lab.display()
        )));
    fcp()
        .arg("simulate")
        .arg("--hardware")
        .arg(&lab)
        .arg(&pl)
        .assert()
        .success()
        .stderr(predicate::str::is_empty());
}

/// A profile file may carry a bundled name (`cluster/h100.toml` is named `h100` by its
/// stem): a plan made with it simulated on the bundled h100 without a word (2.5 ms instead of
/// 460 ms), and a model file named `llama3-70b` on the bundled preset. The plan records the
/// files now, and reading it asks for them again.
#[test]
fn a_profile_file_with_a_bundled_name_is_not_swapped_for_the_bundled_one() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    std::fs::create_dir(&cluster).unwrap();
    let bundled = std::fs::read_to_string("configs/hardware/h100.toml").unwrap();
    let slow = std::iter::once("nvlink_gbs = 1.0")
        .chain(
            bundled
                .lines()
                .filter(|l| !l.starts_with("name") && !l.starts_with("nvlink_gbs")),
        )
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(cluster.join("h100.toml"), slow).unwrap();
    std::fs::write(
        cluster.join("llama3-70b.toml"),
        "q_heads = 64\nkv_heads = 8\nhead_dim = 128\ndtype_bytes = 4\n",
    )
    .unwrap();
    let (hw, model) = (cluster.join("h100.toml"), cluster.join("llama3-70b.toml"));
    let pl = dir.path().join("z.json");
    fcp()
        .args(["plan", "--scheme", "zigzag", "--ranks", "8"])
        .args(["--tokens-per-rank", "4096", "--hardware"])
        .arg(&hw)
        .arg("--model")
        .arg(&model)
        .arg("-o")
        .arg(&pl)
        .assert()
        .success();
    let p: Value = serde_json::from_slice(&std::fs::read(&pl).unwrap()).unwrap();
    assert_eq!(p["hardware"], "h100");
    assert_eq!(p["hardware_file"], hw.display().to_string());
    assert_eq!(p["model_file"], model.display().to_string());
    fcp()
        .arg("simulate")
        .arg(&pl)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains(format!(
            "made for hardware `h100` read from the file {}, not a bundled profile: pass --hardware {} again (or --hardware h100 for the bundled one)",
            hw.display(),
            hw.display()
        )));
    let ms = |args: &[&std::ffi::OsStr]| {
        let v = json(fcp().arg("simulate").arg(&pl).args(args).arg("--json"));
        v["attention_time_ms"].as_f64().unwrap()
    };
    let (h, m) = (hw.as_os_str(), model.as_os_str());
    let (hf, mf) = ("--hardware".as_ref(), "--model".as_ref());
    let with_files = ms(&[hf, h, mf, m]);
    let bundled = ms(&[hf, "h100".as_ref(), mf, "llama3-70b".as_ref()]);
    // One GB/s of NVLink is far slower than the bundled profile's.
    assert!(with_files > 10.0 * bundled, "{with_files} vs {bundled}");
    // The bundled ones when asked for by name, with a note that they are not the plan's.
    fcp()
        .arg("simulate")
        .arg(&pl)
        .args(["--hardware", "h100", "--model"])
        .arg(&model)
        .assert()
        .success()
        .stderr(predicate::str::contains(format!(
            "note: the plan was made for hardware `h100` read from {}; using the bundled `h100` as asked",
            hw.display()
        )));
}

#[test]
fn overlap_bandwidth_reports_gbps() {
    let v = json(fcp().args([
        "hw",
        "overlap-bandwidth",
        "--hardware",
        "h100",
        "--block",
        "4096",
        "--json",
    ]));
    let g = v["gbps"].as_f64().unwrap();
    // FCP §3.5: ~22 GB/s for 4K blocks on Hopper with Llama-3-70B.
    assert!((15.0..30.0).contains(&g), "{g}");
    let small = json(fcp().args(["hw", "overlap-bandwidth", "--block", "1024", "--json"]))["gbps"]
        .as_f64()
        .unwrap();
    assert!(
        small > 2.0 * g,
        "smaller blocks need more bandwidth: {small} vs {g}"
    );
}

/// The split of exposed time: FCP's light ranks wait at the end of the backward pass for dK/dV
/// that busier ranks return after their last step (imbalance: nothing of theirs in flight),
/// while zigzag's balanced ranks wait only on transfers in flight. Both used to be reported as
/// exposed communication alone.
#[test]
fn waiting_on_peers_is_told_apart_from_exposed_communication() {
    let dir = tempfile::tempdir().unwrap();
    let on_peers = |scheme: &str| -> Vec<(f64, f64)> {
        let p = dir.path().join(format!("{scheme}.json"));
        fcp()
            .args(["plan", "--scheme", scheme, "--ranks", "8"])
            .args(["--tokens-per-rank", "16384", "-o"])
            .arg(&p)
            .assert()
            .success();
        let r = json(fcp().arg("simulate").arg(&p).arg("--json"));
        r["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["waiting_on_peers_ms"].as_f64().unwrap(),
                    x["exposed_comm_ms"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let fcp_ranks = on_peers("fcp");
    assert!(
        fcp_ranks.iter().all(|&(p, e)| p <= e + 1e-9),
        "{fcp_ranks:?}"
    );
    let (p, e) = fcp_ranks[7];
    assert!(
        p > 0.5 * e && p > 1.0,
        "rank 7: {p} of {e} ms: {fcp_ranks:?}"
    );
    let zigzag = on_peers("zigzag");
    let (p, e) = zigzag
        .iter()
        .fold((0.0, 0.0), |acc, &(p, e)| (acc.0 + p, acc.1 + e));
    assert!(p < 0.05 * e, "zigzag: {p} of {e} ms on peers: {zigzag:?}");
}

/// The bug: tiles shorter than a kernel table's shortest row (1,024 tokens) ran at that row's
/// throughput, and full-mask rows run twice as fast as causal ones there, so cutting a short
/// causal document into pieces looked cheaper than running it whole: on one GPU, zigzag and
/// per-doc rated 1.19× ring on documents of 100, 200 and 300 tokens, below the lower bound.
#[test]
fn short_documents_cut_in_pieces_do_not_beat_the_lower_bound() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("short.csv");
    std::fs::write(&trace, "doc_len\n100\n200\n300\n57\n900\n1000\n43\n600\n").unwrap();
    for (ranks, tokens) in [("1", "600"), ("2", "1600"), ("4", "800")] {
        let rows = json(
            fcp()
                .args(["compare", "--trace"])
                .arg(&trace)
                .args(["--ranks", ranks, "--tokens-per-rank", tokens])
                .args(["--schemes", "all", "--batches", "1", "--json"]),
        );
        for r in rows.as_array().unwrap() {
            if !r["error"].is_null() {
                continue;
            }
            let (mean, bound) = (
                r["mean_compute_ms"].as_f64().unwrap(),
                r["lower_bound_ms"].as_f64().unwrap(),
            );
            assert!(
                mean >= bound,
                "{} on {ranks} ranks: mean compute {mean} ms < lower bound {bound} ms",
                r["scheme"]
            );
        }
        let ring = &rows[0];
        assert_eq!(ring["scheme"], "ring");
        if ranks == "1" {
            // One GPU: nothing to balance, so cutting only adds cost; ring runs documents whole.
            for r in rows.as_array().unwrap() {
                assert!(
                    r["speedup"].as_f64().unwrap() <= 1.0 + 1e-12,
                    "{}",
                    r["scheme"]
                );
            }
        }
    }
}

const LAYER_KEYS: &[&str] = &[
    "layer_time_ms",
    "linear_mean_ms",
    "linear_max_ms",
    "token_imbalance",
    "layer_lower_bound_ms",
    "layer_vs_lower_bound",
    "layer_mfu",
    "act_max_bytes",
];

#[test]
fn the_whole_layer_is_simulated_on_request_and_adds_the_projections_and_mlp() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), "zigzag", 4);
    let plain = json(fcp().args(["simulate", "--json"]).arg(&p));
    for k in LAYER_KEYS {
        assert!(plain.get(k).is_none(), "{k} without --layer");
    }
    assert!(plain["ranks"][0].get("linear_ms").is_none());
    let v = json(fcp().args(["simulate", "--json", "--layer"]).arg(&p));
    for k in LAYER_KEYS {
        assert!(v[k].is_number(), "missing {k}");
    }
    // The attention figures are the same with or without the layer.
    assert_eq!(v["attention_time_ms"], plain["attention_time_ms"]);
    let f = |k: &str| v[k].as_f64().unwrap();
    // Llama-3-70B at 8K tokens a rank: 1.711 GFLOP a token forward, 3× that with the
    // backward pass, at 794.5 TFLOP/s (the H100's measured GEMM rate).
    let tokens: f64 = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tokens"].as_f64().unwrap())
        .sum::<f64>()
        / 4.0;
    let per_token = 3.0 * 2.0 * (8192.0 * 80.0 * 128.0 + 8192.0 * 8192.0 + 3.0 * 8192.0 * 28672.0);
    let want = tokens * per_token / 794.5e12 * 1e3;
    assert!(
        (f("linear_mean_ms") - want).abs() < 1e-3,
        "{} vs {want}",
        f("linear_mean_ms")
    );
    assert!(f("layer_time_ms") >= f("linear_max_ms"));
    assert!(f("layer_time_ms") > f("attention_time_ms"));
    assert!(f("layer_vs_lower_bound") >= 1.0);
    assert!(v["ranks"][0]["linear_ms"].is_number() && v["ranks"][0]["layer_end_ms"].is_number());
    // Activations kept per layer follow the tokens: the largest rank's is the plan's.
    let act: Vec<u64> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["act_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(
        Some(&v["act_max_bytes"].as_u64().unwrap()),
        act.iter().max()
    );
    for r in v["ranks"].as_array().unwrap() {
        let per_token = r["act_bytes"].as_u64().unwrap() / r["tokens"].as_u64().unwrap();
        assert_eq!(per_token, 274_696, "Llama-3-70B's saved bytes a token");
    }
    assert!(plain["ranks"][0].get("act_bytes").is_none());
    // The table says it too.
    fcp()
        .args(["simulate", "--layer"])
        .arg(&p)
        .assert()
        .success()
        .stdout(predicate::str::contains("whole layer").and(predicate::str::contains("linear_ms")));
    // A model without the layer's widths cannot: exit 2, naming what is missing.
    let mha = dir.path().join("mha.json");
    fcp()
        .args([
            "plan", "--scheme", "ring", "--ranks", "2", "--model", "mha-16", "-o",
        ])
        .arg(&mha)
        .assert()
        .success();
    fcp()
        .args(["simulate", "--layer"])
        .arg(&mha)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "mha-16 gives no `hidden` and `ffn_hidden`",
        ));
}

#[test]
fn recomputation_trades_the_activations_kept_for_the_layers_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan(dir.path(), "zigzag", 4);
    let run = |recompute: &str| {
        json(
            fcp()
                .args(["simulate", "--json", "--layer", "--recompute", recompute])
                .arg(&p),
        )
    };
    let (none, mlp, full) = (run("none"), run("mlp"), run("full"));
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    // Less kept, more time, attention untouched.
    assert!(f(&none, "act_max_bytes") > f(&mlp, "act_max_bytes"));
    assert!(f(&mlp, "act_max_bytes") > f(&full, "act_max_bytes"));
    assert!(f(&none, "layer_time_ms") < f(&mlp, "layer_time_ms"));
    assert!(f(&mlp, "layer_time_ms") < f(&full, "layer_time_ms"));
    assert_eq!(none["attention_time_ms"], full["attention_time_ms"]);
    // Full recomputation keeps each layer's input: 8,192 × 2 bytes a token for Llama-3-70B.
    for r in full["ranks"].as_array().unwrap() {
        assert_eq!(
            r["act_bytes"].as_u64().unwrap(),
            r["tokens"].as_u64().unwrap() * 16384
        );
    }
    // The key says what was recomputed, and is absent when nothing was (outputs unchanged).
    assert_eq!(full["recompute"], "full");
    assert!(none.get("recompute").is_none());
    // Without the layer there is nothing to recompute: exit 2, naming the flag it needs.
    fcp()
        .args(["simulate", "--recompute", "full"])
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--layer"));
    // compare and the layer's Gantt chart take it too; the chart draws the rerun pass.
    let out = fcp()
        .args([
            "compare",
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
            "--batches",
            "1",
        ])
        .args([
            "--schemes",
            "ring",
            "--json",
            "--layer",
            "--recompute",
            "mlp",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(rows[0]["recompute"], "mlp", "{rows}");
    let png = dir.path().join("g.png");
    fcp()
        .args(["plot", "gantt", "--layer", "--recompute", "full", "-o"])
        .arg(&png)
        .arg(&p)
        .assert()
        .success();
    assert!(std::fs::metadata(&png).unwrap().len() > 0);
}

#[test]
fn compare_with_the_layer_adds_its_columns_after_the_others() {
    let run = |layer: bool| {
        let mut c = fcp();
        c.args([
            "compare",
            "--ranks",
            "4",
            "--tokens-per-rank",
            "8192",
            "--batches",
            "1",
        ])
        .args(["--schemes", "ring,zigzag", "--csv"]);
        if layer {
            c.arg("--layer");
        }
        String::from_utf8(c.assert().success().get_output().stdout.clone()).unwrap()
    };
    let plain = run(false);
    let layer = run(true);
    let header = |s: &str| s.lines().next().unwrap().to_string();
    assert!(
        header(&layer).starts_with(&header(&plain)),
        "the old columns keep their places"
    );
    assert!(header(&layer).ends_with("layer_time_ms,layer_speedup,linear_mean_ms,linear_max_ms,token_imbalance,layer_lower_bound_ms,layer_vs_lower_bound,layer_mfu,act_max_bytes"));
    let ring: Vec<&str> = layer.lines().nth(1).unwrap().split(',').collect();
    let speedup = header(&layer)
        .split(',')
        .position(|c| c == "layer_speedup")
        .unwrap();
    assert_eq!(ring[speedup], "1", "ring's layer speedup over itself");
    let v = json(fcp().args([
        "compare",
        "--ranks",
        "4",
        "--tokens-per-rank",
        "8192",
        "--batches",
        "1",
        "--schemes",
        "ring,zigzag",
        "--json",
        "--layer",
    ]));
    let zz = &v[1];
    assert!(zz["layer_speedup"].as_f64().unwrap() > 1.0);
    assert!(zz["layer_time_ms"].as_f64().unwrap() > zz["attention_time_ms"].as_f64().unwrap());
}

/// Regression (bug hunt): window packing planned FCP under the 32K default cap where each
/// rank's share of a 64K window over 8 ranks is 8K, so `compare` disagreed with the same cell
/// of `fcp sweep`, and its header said "8 ranks × 32768 tokens".
#[test]
fn window_packing_caps_each_rank_at_its_share_of_the_window_as_sweep_does() {
    let dir = tempfile::tempdir().unwrap();
    let window = ["--ranks", "8", "--pack", "window", "--context", "65536"];
    let plan_with = |extra: &[&str], name: &str| {
        let out = dir.path().join(name);
        fcp()
            .args(["plan", "--scheme", "fcp"])
            .args(window)
            .args(extra)
            .arg("-o")
            .arg(&out)
            .assert()
            .success();
        std::fs::read(out).unwrap()
    };
    assert_eq!(
        plan_with(&[], "derived.json"),
        plan_with(&["--tokens-per-rank", "8192"], "given.json"),
        "the default is the window's even share"
    );
    assert_ne!(
        plan_with(&[], "derived.json"),
        plan_with(&["--tokens-per-rank", "32768"], "wide.json"),
        "an explicit cap still holds"
    );
    let out = fcp()
        .args(["compare", "--schemes", "fcp", "--batches", "1", "--json"])
        .args(window)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rows: Value = serde_json::from_slice(&out).unwrap();
    fcp()
        .args(["compare", "--schemes", "fcp", "--batches", "1"])
        .args(window)
        .assert()
        .success()
        .stdout(predicate::str::contains("8 ranks × 8192 tokens"));
    // The same cell as a sweep: the same number.
    let results = support::sweep_results(
        "batches = 1\npack = \"window\"\n[grid]\ntraces = [\"default\"]\nschemes = [\"fcp\"]\nranks = [8]\ncontext = [65536]\n",
    );
    let cell = &results[0];
    assert_eq!(cell["tokens_per_rank"], 8192, "{cell}");
    let (c, s) = (
        rows[0]["attention_time_ms"].as_f64().unwrap(),
        cell["metrics"]["attention_time_ms"]["mean"]
            .as_f64()
            .unwrap(),
    );
    assert!((c - s).abs() < 1e-9, "compare {c} vs sweep {s}");
}

/// Regression (bug hunt): `compare`, `demo` and `ablation` cut documents to fit a batch
/// without a word, and `plan` counted the whole trace's cuts, not its batch's.
#[test]
fn commands_say_how_many_documents_of_their_batches_packing_cut() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    // One rank of 1,000 tokens: batch 0 holds the 100, batch 1 the 5,000 cut to 1,000.
    std::fs::write(&trace, "doc_len\n100\n5000\n").unwrap();
    let base = |cmd: &str| {
        let mut c = fcp();
        c.arg(cmd)
            .arg("--trace")
            .arg(&trace)
            .args(["--ranks", "1", "--tokens-per-rank", "1000"]);
        c
    };
    let out = dir.path().join("p.json");
    base("plan")
        .args(["--scheme", "ring", "--batch", "0", "-o"])
        .arg(&out)
        .assert()
        .success()
        .stderr(predicate::str::contains("packing cut").not());
    base("plan")
        .args(["--scheme", "ring", "--batch", "1", "-o"])
        .arg(&out)
        .assert()
        .success()
        .stderr(predicate::str::contains("packing cut 1 document(s)"));
    base("compare")
        .args(["--schemes", "ring", "--batches", "2"])
        .assert()
        .success()
        .stderr(predicate::str::contains("packing cut 1 document(s)"));
    base("compare")
        .args(["--schemes", "ring", "--batches", "1"])
        .assert()
        .success()
        .stderr(predicate::str::contains("packing cut").not());
    // Out of range names how many batches the whole trace packs into.
    base("plan")
        .args(["--scheme", "ring", "--batch", "5", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("packs into 2 batches"));
}

/// Regression (bug hunt): `mfu` counted the attention of padding as model FLOPs, so schemes
/// that pad a document (Ulysses and Llama3 CP to a multiple of 2N, per-doc CP) read up to
/// 3.45× the MFU of the same work unpadded. The model's FLOPs are the batch's, whatever the
/// scheme: MFU × attention time is the same for every scheme, padded or not.
#[test]
fn mfu_counts_the_model_s_flops_not_the_padding_s() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.csv");
    std::fs::write(&t, "doc_len\n17\n45\n").unwrap();
    let out = fcp()
        .args(["compare", "--trace"])
        .arg(&t)
        .args(["--ranks", "16", "--tokens-per-rank", "4", "--batches", "1"])
        .args(["--schemes", "zigzag,ulysses,llama3,per-doc", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let work: Vec<(String, f64, f64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["scheme"].as_str().unwrap().to_string(),
                r["mfu"].as_f64().unwrap() * r["attention_time_ms"].as_f64().unwrap(),
                r["pad_tokens"].as_f64().unwrap(),
            )
        })
        .collect();
    assert!(work.iter().any(|w| w.2 > 0.0), "some scheme pads: {work:?}");
    for w in &work {
        assert!((w.1 - work[0].1).abs() <= 1e-9 * work[0].1, "{work:?}");
    }
}

/// Regression (bug hunt): a plan made with one hardware file, simulated with another file of
/// the same `name`, got no note that the profile differs from the plan's.
#[test]
fn another_file_of_the_same_name_is_noted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let profile = "name = \"lab-gpu\"\npeak_tflops = 989.4\nsm_count = 132\ngpus_per_node = 4\nnvlink_gbs = 200.0\nnvlink_latency_us = 2.0\nnic_gbs = 25.0\nnic_latency_us = 6.0\nlaunch_overhead_us = 4.0\nkernel_profile = \"h100-fa3\"\n";
    std::fs::write(d.join("a.toml"), profile).unwrap();
    std::fs::write(
        d.join("b.toml"),
        profile.replace("nic_gbs = 25.0", "nic_gbs = 50.0"),
    )
    .unwrap();
    std::fs::write(d.join("t.csv"), "doc_len\n1000\n3000\n").unwrap();
    fcp()
        .current_dir(d)
        .args([
            "plan", "--scheme", "zigzag", "--trace", "t.csv", "--ranks", "4",
        ])
        .args(["--hardware", "a.toml", "-o", "p.json"])
        .assert()
        .success();
    fcp()
        .current_dir(d)
        .args(["simulate", "p.json", "--hardware", "b.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "using b.toml, which has the same name",
        ));
    fcp()
        .current_dir(d)
        .args(["simulate", "p.json", "--hardware", "./a.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains("same name").not());
}

/// A directory holding `one.csv`, one document of `len` tokens.
fn one_document(len: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("one.csv"), format!("doc_len\n{len}\n")).unwrap();
    d
}

/// `metric` of every row of `fcp compare --trace one.csv --json ARGS`, run in `dir`.
fn compare_metric(dir: &Path, args: &[&str], metric: &str) -> Vec<f64> {
    let rows = json(
        fcp()
            .current_dir(dir)
            .args(["compare", "--trace", "one.csv", "--batches", "1", "--json"])
            .args(args),
    );
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r[metric].as_f64().unwrap())
        .collect()
}

/// The scheme parameters of `fcp plan --trace one.csv -o - ARGS`, run in `dir`.
fn plan_params(dir: &Path, args: &[&str]) -> Value {
    let plan = json(
        fcp()
            .current_dir(dir)
            .args(["plan", "--trace", "one.csv", "-o", "-"])
            .args(args),
    );
    plan["scheme"]["params"].clone()
}

/// Bug hunt: under `--pass fwd` auto kept its fastest *training* plan and trailed llama3 by
/// 2.2 % on one long document (52.402 against 51.290 ms forward). `auto` and `hybrid` now
/// choose by the passes `compare` simulates, and the plan records them.
#[test]
fn regression_auto_chose_by_training_under_pass_fwd() {
    let d = one_document(131072);
    // Under a budget too (bug hunt: its estimate summed both passes): it compares by the
    // estimate, which now covers the pass judged.
    let schemes = "llama3,auto,auto:budget_ms=100000";
    let args = ["--ranks", "2", "--pass", "fwd", "--schemes", schemes];
    let t = compare_metric(d.path(), &args, "attention_time_ms");
    assert!(t[1] <= t[0], "auto {} vs llama3 {}", t[1], t[0]);
    assert!(t[2] <= t[0], "budgeted auto {} vs llama3 {}", t[2], t[0]);
    let auto = ["--ranks", "2", "--scheme", "auto"];
    assert_eq!(plan_params(d.path(), &auto).get("objective_pass"), None);
    let fwd = plan_params(d.path(), &[&auto[..], &["--pass", "fwd"]].concat());
    assert_eq!(fwd["objective_pass"], "fwd");
}

/// Bug hunt: `auto` and `hybrid` judged the whole layer without the recomputation `compare`
/// priced: under `--recompute full` (the backward pass reruns the forward, where llama3 is
/// faster) auto kept Ulysses' plan, 536.917 ms a layer against llama3's 535.893.
#[test]
fn regression_auto_judged_the_layer_without_recompute() {
    let d = one_document(65536);
    let two = ["--ranks", "2", "--tokens-per-rank", "32768"];
    let layer = compare_metric(
        d.path(),
        &[
            &two[..],
            &[
                "--layer",
                "--recompute",
                "full",
                "--schemes",
                "auto,llama3,ulysses",
            ],
        ]
        .concat(),
        "layer_time_ms",
    );
    assert!(layer[0] <= layer[1] && layer[0] <= layer[2], "{layer:?}");
    let params = plan_params(
        d.path(),
        &[&two[..], &["--scheme", "auto", "--recompute", "full"]].concat(),
    );
    assert_eq!(params["objective_recompute"], "full");
}

/// Regression (bug hunt): a plan chosen for the forward pass (`objective_pass`) or under full
/// recomputation (`objective_recompute`) was simulated for both passes and no recomputation
/// without a word. `simulate` now defaults to what the plan was chosen for and says so, and
/// says when a flag overrides it.
#[test]
fn regression_simulate_defaults_to_the_pass_and_recompute_the_plan_was_chosen_for() {
    let dir = tempfile::tempdir().unwrap();
    let fwd = dir.path().join("fwd.json");
    fcp()
        .args([
            "plan", "--scheme", "hybrid", "--ranks", "4", "--pass", "fwd",
        ])
        .args(["--tokens-per-rank", "8192", "-o"])
        .arg(&fwd)
        .assert()
        .success();
    let sim = |args: &[&str]| {
        support::json_and_stderr(fcp().arg("simulate").arg(&fwd).args(args).arg("--json"))
    };
    let (chosen, note) = sim(&[]);
    assert_eq!(chosen["pass"], "fwd");
    assert!(
        note.contains("simulating --pass fwd, what the plan was chosen for (objective_pass)"),
        "{note}"
    );
    let (asked, note) = sim(&["--pass", "fwd"]);
    assert_eq!(asked, chosen);
    assert!(note.is_empty(), "{note}");
    let (both, note) = sim(&["--pass", "both"]);
    assert_eq!(both["pass"], "both");
    // A priced training step runs both passes whatever the plan was chosen for (bug hunt:
    // it refused until --pass both was given).
    let (step, _) = sim(&["--layer", "--memory", "--micro-batches", "2"]);
    assert_eq!(step["pass"], "both");
    assert!(step["step"]["step_ms"].as_f64().unwrap() > 0.0);
    assert!(
        note.contains(
            "the plan was chosen for --pass fwd (objective_pass); simulating --pass both"
        ),
        "{note}"
    );
    // Recomputation, with the whole layer.
    let full = dir.path().join("full.json");
    fcp()
        .args([
            "plan",
            "--scheme",
            "hybrid",
            "--ranks",
            "4",
            "--recompute",
            "full",
        ])
        .args(["--tokens-per-rank", "8192", "-o"])
        .arg(&full)
        .assert()
        .success();
    let layer = |args: &[&str]| {
        json(
            fcp()
                .arg("simulate")
                .arg(&full)
                .arg("--layer")
                .args(args)
                .arg("--json"),
        )
    };
    let chosen = layer(&[]);
    assert_eq!(chosen, layer(&["--recompute", "full"]));
    assert_ne!(chosen, layer(&["--recompute", "none"]));
    // A plan that records no choice simulates as before: both passes.
    let zigzag = plan(dir.path(), "zigzag", 4);
    let out = fcp()
        .arg("simulate")
        .arg(&zigzag)
        .arg("--json")
        .assert()
        .success()
        .stderr("")
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["pass"], "both");
}

/// Regression (bug hunt): a plan chosen with the TP collectives overlapped
/// (`objective_tp_overlap`) was simulated with them exposed, silently: 111.5 ms a layer
/// against the 105.8 it was chosen at. `simulate --layer` now defaults to the overlap, says
/// so, and `--no-tp-overlap` simulates them exposed.
#[test]
fn regression_simulate_defaults_to_the_tp_overlap_the_plan_was_chosen_for() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("h.json");
    fcp()
        .args(["plan", "--scheme", "hybrid", "--ranks", "4", "--tp", "2"])
        .args(["--tp-overlap", "--tokens-per-rank", "8192", "-o"])
        .arg(&p)
        .assert()
        .success();
    let sim = |args: &[&str]| {
        support::json_and_stderr(
            fcp()
                .arg("simulate")
                .arg(&p)
                .arg("--layer")
                .args(args)
                .arg("--json"),
        )
    };
    let (chosen, note) = sim(&[]);
    assert!(
        note.contains(
            "simulating --tp-overlap, what the plan was chosen for (objective_tp_overlap)"
        ),
        "{note}"
    );
    let (asked, note) = sim(&["--tp-overlap"]);
    assert_eq!(asked, chosen);
    assert!(note.is_empty(), "{note}");
    let (exposed, note) = sim(&["--no-tp-overlap"]);
    assert!(
        note.contains("simulating the TP collectives exposed as asked"),
        "{note}"
    );
    let t = |v: &Value| v["layer_time_ms"].as_f64().unwrap();
    assert!(t(&exposed) > t(&chosen), "{exposed} {chosen}");
}
