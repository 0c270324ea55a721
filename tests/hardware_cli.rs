//! End-to-end tests of `fcp hw ...`.

mod support;

use predicates::prelude::*;
use support::{fcp, json, json_and_stderr};

const USER_TOML: &str = r#"
name = "lab-gpu"
peak_tflops = 500.0
sm_count = 100
gpus_per_node = 4
nvlink_gbs = 200.0
nvlink_latency_us = 2.0
nic_gbs = 25.0
nic_latency_us = 6.0
comm_sms = 10
launch_overhead_us = 4.0
kernel_profile = "my-kernels.csv"
"#;

const USER_CSV: &str = "pass,mask,head_dim,varlen,len_kind,q_len,kv_len,tflops,source
fwd,causal,128,false,total,1024,1024,100,calibration run 1
fwd,causal,128,false,total,4096,4096,300,calibration run 1
";

#[test]
fn list_names_everything_bundled() {
    fcp()
        .args(["hw", "list"])
        .assert()
        .success()
        .stdout(predicate::str::contains("h100"))
        .stdout(predicate::str::contains("b200"))
        .stdout(predicate::str::contains("llama3-70b"))
        .stdout(predicate::str::contains("mha-32"))
        .stdout(predicate::str::contains("h100-fa3"))
        .stdout(predicate::str::contains("h200-8gpu"));
    let out = fcp().args(["hw", "list", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["hardware"].as_array().unwrap().len(), 3);
    assert_eq!(v["models"].as_array().unwrap().len(), 4);
}

#[test]
fn show_json_has_values_sources_and_lookups() {
    let out = fcp()
        .args([
            "hw",
            "show",
            "--hardware",
            "h200",
            "--model",
            "llama3-8b",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hw = &v["hardware"];
    assert_eq!(hw["name"], "h200");
    assert_eq!(hw["peak_tflops"], 989.4);
    assert_eq!(hw["kernel_profile"], "h100-fa3");
    for key in [
        "sm_count",
        "gpus_per_node",
        "nvlink_gbs",
        "nvlink_latency_us",
        "nic_gbs",
        "nic_latency_us",
        "comm_sms",
        "launch_overhead_us",
    ] {
        assert!(hw.get(key).is_some(), "missing {key}");
        assert!(hw["sources"][key].is_string(), "no source for {key}");
    }
    assert_eq!(v["model"]["q_heads"], 32);
    assert!(v["effective_peak_tflops"].is_number());
    let lookups = v["lookups"].as_array().unwrap();
    assert!(!lookups.is_empty());
    assert!(lookups[0]["tflops"].is_number() && lookups[0]["used"].is_string());
}

#[test]
fn show_text() {
    fcp()
        .args(["hw", "show", "--hardware", "b200"])
        .assert()
        .success()
        .stdout(predicate::str::contains("peak_tflops"))
        .stdout(predicate::str::contains("2250"))
        .stdout(predicate::str::contains("ASSUMED"));
}

#[test]
fn kernel_happy_path() {
    fcp()
        .args([
            "hw",
            "kernel",
            "--hardware",
            "h100",
            "--pass",
            "fwd",
            "--mask",
            "causal",
            "--head-dim",
            "128",
            "--q-len",
            "4096",
            "--kv-len",
            "4096",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("662.0 TFLOP/s"))
        .stdout(predicate::str::contains("66.9%"))
        .stdout(predicate::str::contains("exact row 4096x4096"));
    let out = fcp()
        .args([
            "hw",
            "kernel",
            "--hardware",
            "h100",
            "--pass",
            "bwd",
            "--mask",
            "full",
            "--q-len",
            "100000",
            "--varlen",
            "--model",
            "llama3-70b",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["clamped"], "above_max");
    assert_eq!(v["varlen_fallback"], true);
    assert_eq!(v["tflops"], 601.0);
    assert!(v["tile_time_us"].as_f64().unwrap() > 0.0);
}

/// `hw kernel --q-len 18446744073709551615` printed a length of 2⁶⁴ and a 5·10²⁹ µs tile;
/// lengths are held to the document limit (2³² tokens) as everywhere else.
#[test]
fn kernel_lengths_outside_the_document_limit_exit_2() {
    for (flag, len) in [
        ("--q-len", "18446744073709551615"),
        ("--q-len", "0"),
        ("--kv-len", "4294967297"),
    ] {
        let mut args = vec!["hw", "kernel", "--hardware", "h100", "--q-len", "1024"];
        if flag == "--q-len" {
            args[5] = len;
        } else {
            args.extend([flag, len]);
        }
        fcp()
            .args(&args)
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(format!(
                "{flag} must be in 1..=4294967296 tokens, got {len}"
            )));
    }
    fcp()
        .args([
            "hw",
            "kernel",
            "--hardware",
            "h100",
            "--q-len",
            "4294967296",
        ])
        .assert()
        .success();
}

/// Regression (bug hunt): a table given with `--profile` skipped the peak check that a
/// hardware file's own table gets, and printed "efficiency 140.5% of 989.4 TFLOP/s peak".
#[test]
fn a_kernel_table_faster_than_the_peak_is_refused_with_profile_too() {
    let kernel = |hw: &str, table: &str| {
        let line = format!("hw kernel --hardware {hw} --profile {table} --q-len 32768");
        fcp().args(line.split(' ')).assert()
    };
    kernel("h100", "b200-fa4")
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains(
            "is below the 1390 TFLOP/s that kernel profile b200-fa4 measures",
        ));
    kernel("b200", "h100-fa3").success();
}

#[test]
fn kernel_missing_row_exits_2() {
    fcp()
        .args([
            "hw",
            "kernel",
            "--hardware",
            "h100",
            "--pass",
            "bwd",
            "--head-dim",
            "96",
            "--q-len",
            "1024",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no row for bwd causal hd 96"));
}

#[test]
fn unknown_names_exit_2_listing_known() {
    fcp()
        .args(["hw", "show", "--hardware", "a100"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown hardware `a100`"))
        .stderr(predicate::str::contains("h100, h200, b200"));
    fcp()
        .args(["hw", "show", "--hardware", "h100", "--model", "gpt-9"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("llama3-70b"))
        .stderr(predicate::str::contains("mha-16"));
}

#[test]
fn user_toml_and_csv_load_from_their_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lab.toml"), USER_TOML).unwrap();
    std::fs::write(dir.path().join("my-kernels.csv"), USER_CSV).unwrap();
    // Run from elsewhere: the relative CSV path resolves next to the TOML.
    let hw = dir.path().join("lab.toml");
    fcp()
        .current_dir(std::env::temp_dir())
        .args([
            "hw",
            "kernel",
            "--hardware",
            hw.to_str().unwrap(),
            "--q-len",
            "2048",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("200.0 TFLOP/s"))
        // 10 of 100 SMs reserved: 200 · 0.9.
        .stdout(predicate::str::contains("180.0 TFLOP/s with 90 of 100 SMs"))
        .stdout(predicate::str::contains("40.0% of 500 TFLOP/s"));
}

#[test]
fn malformed_user_toml_exits_2_naming_problem() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    std::fs::write(&missing, USER_TOML.replace("nic_gbs = 25.0\n", "")).unwrap();
    fcp()
        .args(["hw", "show", "--hardware", missing.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("missing.toml"))
        .stderr(predicate::str::contains("missing field `nic_gbs`"));
    let typo = dir.path().join("typo.toml");
    std::fs::write(
        &typo,
        USER_TOML.replace("sm_count = 100", "sm_count = \"lots\""),
    )
    .unwrap();
    fcp()
        .args(["hw", "show", "--hardware", typo.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("sm_count"));
    let model = dir.path().join("m.toml");
    std::fs::write(
        &model,
        "q_heads = 12\nkv_heads = 5\nhead_dim = 64\ndtype_bytes = 2\n",
    )
    .unwrap();
    fcp()
        .args([
            "hw",
            "show",
            "--hardware",
            "h100",
            "--model",
            model.to_str().unwrap(),
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a multiple"));
    fcp()
        .args(["hw", "show", "--hardware", "/nonexistent/x.toml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot read hardware file"));
}

/// `nccl_table = "nope"` passed `hw show` and `plan` and failed first in `simulate`, without
/// naming the TOML; the tables a profile names are read with it now.
#[test]
fn a_table_a_profile_names_is_checked_when_the_profile_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("my-kernels.csv"), USER_CSV).unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, USER_TOML).unwrap();
    fcp()
        .args(["hw", "show", "--hardware"])
        .arg(&good)
        .assert()
        .success();
    for (name, extra, field, says) in [
        (
            "nccl.toml",
            "nccl_table = \"nope\"\n",
            "nccl_table",
            "unknown NCCL table `nope`",
        ),
        (
            "nccl-file.toml",
            "nccl_table = \"absent.csv\"\n",
            "nccl_table",
            "absent.csv",
        ),
    ] {
        let bad = dir.path().join(name);
        std::fs::write(&bad, format!("{USER_TOML}{extra}")).unwrap();
        for cmd in [
            vec!["hw", "show"],
            vec!["plan", "--scheme", "ring", "--ranks", "2", "-o", "-"],
        ] {
            fcp()
                .args(&cmd)
                .arg("--hardware")
                .arg(&bad)
                .assert()
                .code(2)
                .stdout("")
                .stderr(predicate::str::contains(format!(
                    "{}: invalid `{field}`",
                    bad.display()
                )))
                .stderr(predicate::str::contains(says));
        }
    }
    let kernels = dir.path().join("kernels.toml");
    std::fs::write(&kernels, USER_TOML.replace("my-kernels.csv", "h100-fa9")).unwrap();
    fcp()
        .args(["hw", "show", "--hardware"])
        .arg(&kernels)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "invalid `kernel_profile`: unknown kernel profile `h100-fa9`",
        ));
}

/// Regression (docs audit): a user model file's `source` was never shown, and a file reusing
/// a preset's `name` was shown with the preset's citation.
#[test]
fn hw_show_cites_the_model_file_it_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("mine.toml");
    std::fs::write(
        &m,
        "name = \"llama3-70b\"\nq_heads = 8\nkv_heads = 8\nhead_dim = 64\ndtype_bytes = 2\nsource = \"my lab config\"\n",
    )
    .unwrap();
    fcp()
        .args(["hw", "show", "--hardware", "h100", "--model"])
        .arg(&m)
        .assert()
        .success()
        .stdout(predicate::str::contains("my lab config"))
        .stdout(predicate::str::contains("Meta-Llama-3-70B").not());
}

/// `--hardware NAME:key=value,...` asks "what if": a plan made on it records the whole spec,
/// `simulate` reloads the same profile from it, and a slower NIC slows a plan that crosses
/// nodes. A bad override is refused before anything is written.
#[test]
fn what_if_overrides_plan_simulate_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let spec = "h100:nic_gbs=5";
    fcp()
        .args([
            "plan",
            "--scheme",
            "zigzag",
            "--ranks",
            "16",
            "--hardware",
            spec,
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(plan["hardware"], spec);
    let time = |extra: &[&str]| {
        let (v, notes) = json_and_stderr(fcp().arg("simulate").arg(&out).arg("--json").args(extra));
        (
            v["attention_time_ms"].as_f64().unwrap(),
            v["hardware"].clone(),
            notes,
        )
    };
    let (slow, name, notes) = time(&[]);
    assert_eq!((name.as_str(), notes.as_str()), (Some(spec), ""));
    let (fast, name, notes) = time(&["--hardware", "h100"]);
    assert_eq!(name, "h100");
    assert!(
        notes.contains("made for hardware `h100:nic_gbs=5`; using `h100`"),
        "{notes}"
    );
    assert!(slow > 1.5 * fast, "{slow} vs {fast}");
    let shown = json(fcp().args(["hw", "show", "--hardware", spec, "--json"]));
    assert_eq!(shown["hardware"]["nic_gbs"], 5.0);
    let bad = dir.path().join("bad.json");
    fcp()
        .args(["plan", "--scheme", "zigzag", "--ranks", "16"])
        .args(["--hardware", "h100:nic_gb=5", "-o"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "`nic_gb`: is not a field an override may set",
        ));
    assert!(!bad.exists());
}

/// Regression: a what-if peak changed only the MFU (attention is priced from the kernel
/// table), and a what-if NVLink speed left the collectives the NCCL table prices as fast. On
/// one node (every message on NVLink), twice the peak about halves the compute, and a quarter
/// of the NVLink speed slows Llama3's all-gathers as it slows Ulysses' all-to-alls.
#[test]
fn regression_what_if_peak_and_nvlink_reach_the_tables() {
    let run = |hw: &str| {
        let v = json(fcp().args([
            "compare",
            "--ranks",
            "8",
            "--batches",
            "1",
            "--json",
            "--schemes",
            "llama3,ulysses",
            "--hardware",
            hw,
        ]));
        let rows = v.as_array().unwrap().clone();
        let get = |name: &str, key: &str| {
            rows.iter().find(|r| r["scheme"] == name).unwrap()[key]
                .as_f64()
                .unwrap()
        };
        (
            get("llama3", "max_compute_ms"),
            get("llama3", "attention_time_ms"),
            get("ulysses", "attention_time_ms"),
        )
    };
    let (compute, llama3, ulysses) = run("h100");
    let (fast_compute, ..) = run("h100:peak_tflops=1978.8");
    let ratio = fast_compute / compute;
    assert!((0.5..0.52).contains(&ratio), "{fast_compute} / {compute}");
    let (_, slow_llama3, slow_ulysses) = run("h100:nvlink_gbs=95");
    assert!(slow_ulysses > 1.3 * ulysses, "{slow_ulysses} vs {ulysses}");
    assert!(slow_llama3 > 1.1 * llama3, "{slow_llama3} vs {llama3}");
    let shown = json(fcp().args([
        "hw",
        "show",
        "--json",
        "--hardware",
        "h100:peak_tflops=1978.8,nvlink_gbs=95",
    ]));
    assert_eq!(shown["kernel_scale"], 2.0);
    assert_eq!(shown["nccl_scale"], 0.25);
    // `hw kernel` reads the same table, named or not (bug hunt: `--profile` was unscaled and
    // refused a peak below the table).
    for profile in [&[][..], &["--profile", "h100-fa3"][..]] {
        let v = json(
            fcp()
                .args(["hw", "kernel", "--json", "--q-len", "4096"])
                .args(["--hardware", "h100:peak_tflops=494.7"])
                .args(profile),
        );
        assert_eq!(v["tflops"], 331.0, "{profile:?}");
    }
}

/// Regressions (bug hunt) of what-if overrides and the files around them: a file in the
/// working directory named like a spec shadowed the bundled profile; a plan made on a bundled
/// profile was simulated on a file of the same name without a word; the same file spelled
/// two ways got a note that they were two files.
#[test]
fn regression_what_if_specs_beside_files_of_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("h100:nic_gbs=10");
    let make = |out: &std::path::Path| {
        fcp()
            .current_dir(dir.path())
            .args(["plan", "--scheme", "zigzag", "--ranks", "16", "--hardware"])
            .arg("h100:nic_gbs=10")
            .arg("-o")
            .arg(out)
            .assert()
            .success();
    };
    make(&plan);
    // The plan file now exists under the spec's name; the spec still means the bundled H100.
    make(&dir.path().join("again.json"));
    let h100 = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/hardware/h100.toml"),
    )
    .unwrap();
    std::fs::write(dir.path().join("h100.toml"), h100).unwrap();
    let notes = |arg: &str| {
        let out = fcp()
            .current_dir(dir.path())
            .args(["simulate", "again.json", "--hardware", arg])
            .assert()
            .success()
            .get_output()
            .stderr
            .clone();
        String::from_utf8(out).unwrap()
    };
    let n = notes("h100.toml:nic_gbs=10");
    assert!(
        n.contains("made for the bundled hardware `h100:nic_gbs=10`; using h100.toml:nic_gbs=10, which has the same name"),
        "{n}"
    );
    // A plan made on the file, simulated on the same file spelled another way: no note.
    fcp()
        .current_dir(dir.path())
        .args(["plan", "--scheme", "zigzag", "--ranks", "16"])
        .args(["--hardware", "h100.toml:nic_gbs=10", "-o", "file.json"])
        .assert()
        .success();
    let out = fcp()
        .current_dir(dir.path())
        .args([
            "simulate",
            "file.json",
            "--hardware",
            "./h100.toml:nic_gbs=10",
        ])
        .assert()
        .success()
        .get_output()
        .stderr
        .clone();
    assert_eq!(String::from_utf8(out).unwrap(), "");
}

/// Regression (bug hunt): `hw show`'s text dropped the `[sources]` entries of
/// `kernel_profile` and `nccl_table` that `--json` gives, and a model's layer widths when it
/// has no `layers` and `vocab`.
#[test]
fn regression_show_text_gives_what_json_gives() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("cite.toml");
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/hardware/h100.toml"
    ))
    .unwrap();
    std::fs::write(
        &hw,
        format!("{base}kernel_profile = \"CITED-KP\"\nnccl_table = \"CITED-NCCL\"\n"),
    )
    .unwrap();
    let model = dir.path().join("lin.toml");
    std::fs::write(
        &model,
        "q_heads = 32\nkv_heads = 8\nhead_dim = 128\ndtype_bytes = 2\nhidden = 4096\nffn_hidden = 14336\nffn_matrices = 2\n",
    )
    .unwrap();
    fcp()
        .args(["hw", "show", "--hardware"])
        .arg(&hw)
        .arg("--model")
        .arg(&model)
        .assert()
        .success()
        .stdout(predicate::str::contains("h100-fa3   CITED-KP"))
        .stdout(predicate::str::contains("h200-8gpu   CITED-NCCL"))
        .stdout(predicate::str::contains(
            "  hidden 4096, ffn_hidden 14336 × 2 matrices (no layers and vocab",
        ));
}
