//! Regressions from a fuzzing pass over the command line: each input once panicked, destroyed
//! an input, or exited 0 where it should have said what was wrong.

mod support;

use std::path::Path;
use support::fcp;

use predicates::prelude::*;

fn trace(dir: &Path) -> std::path::PathBuf {
    let t = dir.join("t.csv");
    std::fs::write(&t, "doc_len\n100\n300\n").unwrap();
    t
}

/// A small valid plan, `DIR/p.json`.
fn small_plan(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("p.json");
    fcp()
        .args([
            "plan",
            "--scheme",
            "ring",
            "--ranks",
            "2",
            "--tokens-per-rank",
            "512",
            "-o",
        ])
        .arg(&p)
        .assert()
        .success();
    p
}

/// `fcp plan --trace t.csv -o t.csv` replaced the user's trace with the plan.
#[test]
fn an_output_that_is_the_input_is_refused_and_the_input_kept() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let before = std::fs::read(&t).unwrap();
    let link = dir.path().join("alias.csv");
    std::os::unix::fs::symlink(&t, &link).unwrap();
    for out in [&t, &link] {
        for cmd in [
            vec!["plan", "--scheme", "ring", "--ranks", "2"],
            vec!["ilp", "--scheme", "fcp", "--ranks", "2"],
        ] {
            fcp()
                .args(&cmd)
                .arg("--trace")
                .arg(&t)
                .arg("-o")
                .arg(out)
                .assert()
                .code(2)
                .stderr(predicate::str::contains("would destroy the input"));
            assert_eq!(std::fs::read(&t).unwrap(), before, "{cmd:?} -o {out:?}");
        }
    }
    fcp()
        .args(["plot", "cdf"])
        .arg(&t)
        .arg("-o")
        .arg(&t)
        .assert()
        .code(2);
    assert_eq!(std::fs::read(&t).unwrap(), before);
}

/// Regression (bug hunt): only the trace was guarded. `fcp plan --hardware my.toml -o
/// my.toml` replaced the hardware profile (so did `--model`, and an output over the kernel
/// table the profile names), and `fcp sweep -o DIR` and `fcp dpcp -o DIR` a trace their
/// config kept in `DIR` under the name of a results file. Every file a command reads is now
/// kept from its outputs.
#[test]
fn no_output_replaces_any_file_the_command_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let t = trace(d);
    let hw = d.join("my.toml");
    std::fs::write(
        &hw,
        "name = \"lab-gpu\"\npeak_tflops = 989.4\nsm_count = 132\ngpus_per_node = 4\nnvlink_gbs = 200.0\nnvlink_latency_us = 2.0\nnic_gbs = 25.0\nnic_latency_us = 6.0\nlaunch_overhead_us = 4.0\nkernel_profile = \"h100-fa3\"\n",
    )
    .unwrap();
    let model = d.join("m.toml");
    std::fs::write(
        &model,
        "name = \"m\"\nq_heads = 8\nkv_heads = 8\nhead_dim = 128\ndtype_bytes = 2\n",
    )
    .unwrap();
    for (flag, file) in [("--hardware", &hw), ("--model", &model)] {
        let before = std::fs::read(file).unwrap();
        for cmd in [
            vec!["plan", "--scheme", "zigzag", "--ranks", "2"],
            vec!["ilp", "--scheme", "fcp", "--ranks", "2"],
        ] {
            fcp()
                .args(&cmd)
                .arg("--trace")
                .arg(&t)
                .arg(flag)
                .arg(file)
                .arg("-o")
                .arg(file)
                .assert()
                .code(2)
                .stderr(predicate::str::contains("would destroy the input"));
            assert_eq!(std::fs::read(file).unwrap(), before, "{cmd:?} {flag}");
        }
    }
    // A sweep and a dpcp study whose trace sits where their results go.
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    for (name, cmd, config) in [
        (
            "results.csv",
            "sweep",
            "batches = 1\n[grid]\ntraces = [\"out/results.csv\"]\nschemes = [\"zigzag\"]\nranks = [2]\n",
        ),
        (
            "dpcp.csv",
            "dpcp",
            "name = \"d\"\ngpus = 4\ncp = [2]\ntokens_per_gpu = 64\nsteps = 1\ntrace = \"out/dpcp.csv\"\n",
        ),
    ] {
        let kept = out.join(name);
        std::fs::copy(&t, &kept).unwrap();
        let before = std::fs::read(&kept).unwrap();
        let cfg = d.join(format!("{cmd}.toml"));
        std::fs::write(&cfg, config).unwrap();
        // Twice: a sweep's rerun finds every cell cached and reads its trace only to hash it
        // (bug hunt: the rerun then replaced it).
        for _ in 0..2 {
            fcp()
                .current_dir(d)
                .arg(cmd)
                .arg(&cfg)
                .arg("-o")
                .arg(&out)
                .args(if cmd == "sweep" { &["-q"][..] } else { &[] })
                .assert()
                .code(2)
                .stderr(predicate::str::contains("would destroy the input"));
            assert_eq!(std::fs::read(&kept).unwrap(), before, "{cmd}");
            // Refused before any work: no cell was computed for results that cannot land.
            assert!(!out.join("cells").exists(), "{cmd}");
        }
    }
}

/// `fcp plan --all-batches -o pd` over a trace named `pd/batch-00000.json` replaced the
/// trace with its own plan (the single-file `-o` refused it already).
#[test]
fn all_batches_into_the_trace_s_own_folder_keeps_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let pd = dir.path().join("pd");
    std::fs::create_dir(&pd).unwrap();
    let t = pd.join("batch-00000.json");
    std::fs::write(&t, "[100,200,300,400,500,600,700,800,900]\n").unwrap();
    fcp()
        .args(["plan", "--scheme", "zigzag", "--ranks", "2"])
        .args(["--tokens-per-rank", "500", "--all-batches", "--trace"])
        .arg(&t)
        .arg("-o")
        .arg(&pd)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("would destroy the input"));
    assert_eq!(
        std::fs::read_to_string(&t).unwrap(),
        "[100,200,300,400,500,600,700,800,900]\n"
    );
    assert_eq!(
        std::fs::read_dir(&pd).unwrap().count(),
        1,
        "nothing written"
    );
}

/// A second `--all-batches` run with fewer batches left the first run's later plans in the
/// folder without a word; they stay (the user's files) and are named.
#[test]
fn all_batches_names_the_plans_an_earlier_run_left() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("s3.csv");
    std::fs::write(&t, "doc_len\n100\n200\n300\n").unwrap();
    let out = dir.path().join("plans");
    let run = |tokens: &str| {
        fcp()
            .args([
                "plan",
                "--scheme",
                "zigzag",
                "--ranks",
                "2",
                "--all-batches",
            ])
            .args(["--tokens-per-rank", tokens, "--trace"])
            .arg(&t)
            .arg("-o")
            .arg(&out)
            .assert()
            .success()
    };
    run("50").stderr(
        predicate::str::contains("wrote 3 plans").and(predicate::str::contains("also holds").not()),
    );
    run("300").stderr(
        predicate::str::contains("wrote 1 plan (zigzag)").and(predicate::str::contains(
            "also holds 2 plan files this run did not write (batch-00001.json, batch-00002.json), from an earlier run",
        )),
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 3);
}

/// Each of these panicked (exit 101) or exited 0.
#[test]
fn usage_errors_exit_2_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let t = t.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        // Divided by zero in the block cutter.
        (
            &["ilp", "--scheme", "fcp", "--ranks", "2", "--block", "0"],
            "--block",
        ),
        // Indexed an empty scheme list.
        (
            &[
                "compare",
                "--ranks",
                "2",
                "--schemes",
                ",",
                "--batches",
                "1",
            ],
            "lists no scheme",
        ),
        (
            &["compare", "--ranks", "2", "--schemes", "", "--json"],
            "lists no scheme",
        ),
        // Skipped the empty entry and compared the rest without a word.
        (
            &[
                "compare",
                "--ranks",
                "2",
                "--schemes",
                "ring,,zigzag",
                "--batches",
                "1",
            ],
            "scheme list `ring,,zigzag`: entry 2 is empty",
        ),
        // Every scheme failed, yet exit 0.
        (
            &[
                "compare",
                "--ranks",
                "3",
                "--schemes",
                "ulysses",
                "--batches",
                "1",
            ],
            "no scheme could plan",
        ),
        // Ran one batch.
        (&["demo", "--batches", "0"], "--batches"),
        // Made a directory named `-`.
        (
            &[
                "plan",
                "--scheme",
                "ring",
                "--ranks",
                "2",
                "--all-batches",
                "-o",
                "-",
            ],
            "--all-batches",
        ),
    ];
    for (args, needle) in cases {
        let with_trace = ["--trace", t];
        let extra: &[&str] = if args[0] == "demo" { &[] } else { &with_trace };
        fcp()
            .current_dir(dir.path())
            .args(*args)
            .args(extra)
            .assert()
            .code(2)
            .stderr(
                predicate::str::contains(*needle).and(predicate::str::contains("panicked").not()),
            );
    }
    assert!(!dir.path().join("-").exists());
}

#[test]
fn a_nan_tolerance_is_a_usage_error_not_a_failed_plan() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_plan(dir.path());
    for tol in ["NaN", "-1"] {
        fcp()
            .args(["verify", "--numeric", &format!("--tolerance={tol}")])
            .arg(&p)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("--tolerance"));
    }
}

/// `plot gantt` drew a plan that `verify` rejects and `simulate` refuses.
#[test]
fn gantt_refuses_an_invalid_plan() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_plan(dir.path());
    let mut plan = fcp::Plan::load(&p).unwrap();
    plan.transfers.clear();
    plan.save(&p).unwrap();
    let png = dir.path().join("g.png");
    fcp()
        .args(["plot", "gantt"])
        .arg(&p)
        .arg("-o")
        .arg(&png)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a valid plan"));
    assert!(!png.exists());
}

/// A missing folder is named; the random temporary file is not, and the cause once.
#[test]
fn io_errors_name_the_path_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("missing").join("p.json");
    let err = fcp()
        .args(["plan", "--scheme", "ring", "--ranks", "2", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(err).unwrap();
    assert!(err.contains("cannot create a file in"), "{err}");
    assert!(!err.contains(".fcp-"), "{err}");
    let err = fcp()
        .args(["trace", "stats"])
        .arg(dir.path().join("nope.csv"))
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(err).unwrap();
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

/// `fcp trace stats /dev/zero` read forever: a CSV field with no end. A binary or compressed
/// file now stops at once with what it looks like.
#[test]
fn binary_and_compressed_traces_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    if Path::new("/dev/zero").exists() {
        fcp()
            .args(["trace", "stats", "/dev/zero"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("byte 0 is NUL"));
    }
    let gz = dir.path().join("t.csv.gz");
    std::fs::write(&gz, b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03doc_len").unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&gz)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gzip-compressed"));
    fcp()
        .args(["trace", "stats", "-"])
        .write_stdin(&b"doc_len\n100\n\x00\n"[..])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("byte 12 is NUL"));
}

/// Regression (bug hunt): a NUL byte on line 3 of a JSONL trace was reported on "line 1",
/// the line being read when the reader met it reading ahead. It now names the byte and the
/// file, as the CSV reader does.
#[test]
fn regression_a_nul_byte_in_jsonl_was_put_on_line_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nul.jsonl");
    let text = b"{\"doc_lens\":[1]}\n{\"doc_lens\":[2]}\n{\"doc_lens\":[3\x00]}\n";
    std::fs::write(&path, text).unwrap();
    for source in [Some(&path), None] {
        let mut cmd = fcp();
        cmd.args(["trace", "stats"]);
        match source {
            Some(p) => cmd.arg(p),
            None => cmd.arg("-").write_stdin(&text[..]),
        };
        let err = cmd.assert().code(2).get_output().stderr.clone();
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("byte 48 is NUL"), "{err}");
        assert!(!err.contains("line 1"), "{err}");
        let named = if source.is_some() {
            "nul.jsonl"
        } else {
            "cannot read -"
        };
        assert!(err.contains(named), "{err}");
    }
}

/// Text that never ends a line (`yes 1 | tr -d '\n' | fcp trace stats -`) was gathered into
/// memory until the machine ran out; it now stops after 64 MiB with what it saw.
#[test]
fn a_line_that_never_ends_is_refused() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("fcp"))
        .args(["trace", "stats", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Feeds digits until fcp stops reading and the pipe breaks.
    let feeder = std::thread::spawn(move || {
        let chunk = [b'1'; 1 << 16];
        while stdin.write_all(&chunk).is_ok() {}
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the line starting at byte 0 runs on for more than 64 MiB"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

/// A byte-order mark before JSONL (Notepad writes one) was read as invalid JSON.
#[test]
fn a_byte_order_mark_before_jsonl_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.jsonl");
    std::fs::write(&t, b"\xEF\xBB\xBF{\"doc_lens\": [100, 300]}\n").unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&t)
        .assert()
        .success()
        .stdout(predicate::str::contains("400"));
    fcp()
        .args(["trace", "stats", "-"])
        .write_stdin(&b"\xEF\xBB\xBF[100, 300]"[..])
        .assert()
        .success()
        .stdout(predicate::str::contains("400"));
}

/// `fcp verify --numeric` of a valid plan with a 2³²-token document asked for 128 GiB of
/// random K/V and aborted (exit 134). It is refused now, before anything is allocated, and
/// the structural check still answers.
#[test]
fn the_numeric_check_of_a_four_billion_token_document_is_refused_not_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("big.csv");
    std::fs::write(&t, "doc_len\n4294967296\n").unwrap();
    let p = dir.path().join("big.json");
    fcp()
        .args(["plan", "--scheme", "ring", "--ranks", "2", "--mask", "full"])
        .args(["--tokens-per-rank", "2147483648", "--trace"])
        .arg(&t)
        .arg("-o")
        .arg(&p)
        .assert()
        .success();
    fcp().arg("verify").arg(&p).assert().success();
    fcp()
        .args(["verify", "--numeric"])
        .arg(&p)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains("too large for the numeric check"))
        .stderr(predicate::str::contains("document 0 (4294967296 tokens)"))
        // Regression (bug hunt): fewer rows cannot shrink a document's K/V; it said to try.
        .stderr(predicate::str::contains("rely on the structural check"))
        .stderr(predicate::str::contains("--max-rows").not());
}

/// The plan at `p` with `edit` applied to its JSON, written to `DIR/name`.
fn edited_plan(
    dir: &Path,
    p: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> std::path::PathBuf {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    edit(&mut v);
    let out = dir.join(name);
    std::fs::write(&out, serde_json::to_string(&v).unwrap()).unwrap();
    out
}

/// Hand-edited plan fields were accepted: `grad_bytes` of 0, -4 or "x" verified and simulated
/// (with the model's dtype, or free gradient traffic), `pad_slots` of 2⁶³ verified and then
/// panicked `verify --numeric` and `simulate` on an overflowing sum, and a `pad_slots` of the
/// wrong type was refused without naming the field.
#[test]
fn hand_edited_plan_fields_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_plan(dir.path());
    for bad in [
        serde_json::json!(0),
        serde_json::json!(-4),
        serde_json::json!("x"),
    ] {
        let g = edited_plan(dir.path(), &p, "g.json", |v| {
            v["scheme"]["params"]["grad_bytes"] = bad.clone()
        });
        fcp()
            .arg("verify")
            .arg(&g)
            .assert()
            .code(1)
            .stdout(predicate::str::contains(format!(
                "violation: Header: scheme.params.grad_bytes is {bad}: it must be a whole number of bytes per gradient element from 1 to 8"
            )));
        fcp()
            .arg("simulate")
            .arg(&g)
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains("scheme.params.grad_bytes"));
    }
    let huge = edited_plan(dir.path(), &p, "huge.json", |v| {
        for r in v["ranks"].as_array_mut().unwrap() {
            r["pad_slots"] = serde_json::json!(1u64 << 63);
        }
    });
    for args in [
        &["verify"][..],
        &["verify", "--numeric"],
        &["verify", "--json"],
    ] {
        fcp()
            .args(args)
            .arg(&huge)
            .assert()
            .code(1)
            .stdout(predicate::str::contains(
                "rank entry 1 has pad_slots 9223372036854775808, more than the 4294967296 (2^32) buffer slots a rank may pad",
            ))
            .stderr(predicate::str::contains("panicked").not());
    }
    let measured = dir.path().join("measured.json");
    std::fs::write(&measured, "{}").unwrap();
    for cmd in [
        vec!["simulate".into(), huge.clone().into_os_string()],
        vec![
            "validate".into(),
            "--plan".into(),
            huge.clone().into_os_string(),
            "--measured".into(),
            measured.clone().into_os_string(),
        ],
        vec![
            "plot".into(),
            "gantt".into(),
            huge.clone().into_os_string(),
            "-o".into(),
            dir.path().join("g.png").into_os_string(),
        ],
    ] {
        fcp()
            .args(&cmd)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("not a valid plan"))
            .stderr(predicate::str::contains("panicked").not());
    }
    for (bad, says) in [
        (
            serde_json::json!(-1),
            "ranks[1].pad_slots: invalid value: integer `-1`, expected u64",
        ),
        (
            serde_json::json!("x"),
            "ranks[1].pad_slots: invalid type: string \"x\", expected u64",
        ),
    ] {
        let q = edited_plan(dir.path(), &p, "q.json", |v| {
            v["ranks"][1]["pad_slots"] = bad
        });
        for cmd in ["verify", "simulate"] {
            fcp()
                .arg(cmd)
                .arg(&q)
                .assert()
                .code(2)
                .stdout("")
                .stderr(predicate::str::contains(says));
        }
    }
}

/// A plan edited so that rank 0 had more steps than the others verified (exit 0),
/// though every rank has the same number of steps.
#[test]
fn a_plan_whose_ranks_have_different_step_counts_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_plan(dir.path());
    let uneven = edited_plan(dir.path(), &p, "uneven.json", |v| {
        let steps = v["ranks"][0]["steps"].as_array_mut().unwrap();
        steps.push(serde_json::json!({"tasks": []}));
        steps.push(serde_json::json!({"tasks": []}));
    });
    fcp()
        .arg("verify")
        .arg(&uneven)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("violation: StepCount: rank 1 has"))
        .stdout(predicate::str::contains(
            "every rank has the same number of steps",
        ));
}

/// A plan saved by an editor that writes a byte-order mark (Notepad) was refused as
/// `expected value at line 1 column 1`; it is read like the same plan without one, as trace
/// files are.
#[test]
fn a_byte_order_mark_before_a_plan_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_plan(dir.path());
    let text = std::fs::read(&p).unwrap();
    let bom = dir.path().join("bom.json");
    std::fs::write(&bom, [&b"\xEF\xBB\xBF"[..], &text].concat()).unwrap();
    let out = |args: &[&str], file: &Path| {
        fcp()
            .args(args)
            .arg(file)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone()
    };
    for args in [&["simulate", "--json"][..], &["verify", "--json"]] {
        assert_eq!(out(args, &bom), out(args, &p), "{args:?}");
    }
    fcp()
        .args(["verify", "-"])
        .write_stdin([&b"\xEF\xBB\xBF"[..], &text].concat())
        .assert()
        .success()
        .stdout(predicate::str::contains("-: valid"));
}

/// `--context` with budget (or carry) packing was silently ignored by `plan`, `compare`,
/// `demo`, `ilp` and `ablation`, while `fcp sweep` refuses `grid.context` without
/// `pack = "window"`; they refuse it the same way now, before writing anything.
#[test]
fn context_without_window_packing_is_refused_like_sweep_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = out.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["plan", "--scheme", "ring", "--ranks", "2", "-o", o],
        &[
            "compare",
            "--ranks",
            "2",
            "--schemes",
            "ring",
            "--batches",
            "1",
        ],
        &["demo", "--ranks", "2", "--batches", "1"],
        &["ilp", "--scheme", "fcp", "--ranks", "2", "-o", o],
        &["ablation", "--ranks", "2"],
    ];
    for args in cases {
        for pack in [&[][..], &["--pack", "budget"], &["--pack", "carry"]] {
            fcp()
                .args(*args)
                .args(pack)
                .args(["--context", "4096"])
                .assert()
                .code(2)
                .stdout("")
                .stderr(predicate::str::diff(
                    "error: --context applies only to --pack window or --pack wlb\n",
                ));
        }
    }
    assert!(!out.exists());
    // The sweep's wording comes from the same helper.
    let cfg = dir.path().join("s.toml");
    std::fs::write(
        &cfg,
        "[grid]\ntraces = [\"default\"]\nschemes = [\"ring\"]\nranks = [2]\ncontext = [4096]\n",
    )
    .unwrap();
    fcp()
        .arg("sweep")
        .arg(&cfg)
        .arg("-o")
        .arg(dir.path().join("sw"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "grid.context applies only to pack = \"window\" or \"wlb\"",
        ));
    // With window packing it is taken, and without `--context` the help's default applies.
    fcp()
        .args([
            "plan", "--scheme", "ring", "--ranks", "2", "--pack", "window",
        ])
        .args(["--context", "4096", "-o", o])
        .assert()
        .success();
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let tokens: u64 = plan["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["len"].as_u64().unwrap())
        .sum();
    assert_eq!(tokens, 4096);
}

/// Duplicates were taken without a word: a JSONL trace object naming `doc_lens` twice kept
/// the last, a sweep's `ranks = [4, 4]` ran each cell twice, a DP×CP study's `cp = [2, 2]` made
/// each row twice, and a regress baseline recording a cell twice checked it twice against two
/// sets of numbers. Each is refused, naming the duplicate and where it is.
#[test]
fn duplicates_are_refused_naming_the_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.jsonl");
    std::fs::write(
        &t,
        "{\"doc_lens\": [100]}\n{\"doc_lens\": [100, 200], \"doc_lens\": [300]}\n",
    )
    .unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&t)
        .assert()
        .code(2)
        .stderr(predicate::str::diff(
            "error: line 2: the object names `doc_lens` twice; which value it means is ambiguous\n",
        ));
    fcp()
        .args(["plan", "--scheme", "ring", "--ranks", "2", "--trace"])
        .arg(&t)
        .args(["-o", "-"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains(
            "line 2: the object names `doc_lens` twice",
        ));

    let sweep = dir.path().join("s.toml");
    std::fs::write(
        &sweep,
        "[grid]\ntraces = [\"default\"]\nschemes = [\"ring\"]\nranks = [4, 8, 4]\n",
    )
    .unwrap();
    fcp()
        .arg("sweep")
        .arg(&sweep)
        .arg("-o")
        .arg(dir.path().join("sw"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("grid.ranks lists 4 twice"));
    assert!(!dir.path().join("sw").exists());

    let dpcp = dir.path().join("d.toml");
    std::fs::write(
        &dpcp,
        "gpus = 8\ncp = [1, 2, 2]\ntokens_per_gpu = 1024\ntrace = \"default\"\n",
    )
    .unwrap();
    fcp()
        .arg("dpcp")
        .arg(&dpcp)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cp lists 2 twice"));

    let cell = r#"{"trace":"default","scheme":"zigzag","ranks":4,"tokens_per_rank":8192,
        "block":null,"context":null,"hardware":"h100","model":"llama3-70b",
        "compute_imbalance":0.1,"comm_imbalance":0.1,"attention_time_ms":1.0}"#;
    let other = cell.replace("zigzag", "fcp");
    let base = dir.path().join("baseline.json");
    std::fs::write(
        &base,
        format!(
            r#"{{"version":1,"tolerance":0.03,"grid":{{"batches":1,"grid":{{"traces":["default"],
            "schemes":["zigzag","fcp"],"ranks":[4],"tokens_per_rank":[8192]}}}},
            "cells":[{cell},{other},{cell}]}}"#
        ),
    )
    .unwrap();
    regress_refuses(
        &base,
        "the cell default · zigzag · 4 ranks × 8192 tok · h100 · llama3-70b is recorded twice (cells[0] and cells[2])",
    );
}

/// `fcp regress` on `base`, checking and with `--update`, exits 2 saying `says`, and leaves
/// the file as it was.
fn regress_refuses(base: &Path, says: &str) {
    let before = std::fs::read(base).unwrap();
    for update in [&[][..], &["--update"]] {
        fcp()
            .arg("regress")
            .args(update)
            .arg("--baseline")
            .arg(base)
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(says));
    }
    assert_eq!(std::fs::read(base).unwrap(), before);
}

/// Regression (bug hunt): a baseline recording a negative time gated against it ("REGRESSED
/// -1.0000 → 32.0255"), and a top-level key of the user's was accepted, then silently dropped
/// by `--update`. Both are refused, with the file left as it was.
#[test]
fn regression_a_baseline_with_a_negative_number_or_an_unknown_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cell = |t: &str| {
        format!(
            r#"{{"trace":"default","scheme":"zigzag","ranks":4,"tokens_per_rank":8192,
        "block":null,"context":null,"hardware":"h100","model":"llama3-70b",
        "compute_imbalance":0.1,"comm_imbalance":0.1,"attention_time_ms":{t}}}"#
        )
    };
    let grid = r#""grid":{"batches":1,"grid":{"traces":["default"],"schemes":["zigzag"],"ranks":[4],"tokens_per_rank":[8192]}}"#;
    for (extra, time, says) in [
        (
            "",
            "-1",
            "the cell default · zigzag · 4 ranks × 8192 tok · h100 · llama3-70b records attention_time_ms -1; recorded numbers are ≥ 0",
        ),
        (r#""note":"mine","#, "1.0", "unknown field `note`"),
    ] {
        let base = dir.path().join("baseline.json");
        std::fs::write(
            &base,
            format!(
                r#"{{"version":1,"tolerance":0.03,{extra}{grid},"cells":[{}]}}"#,
                cell(time)
            ),
        )
        .unwrap();
        regress_refuses(&base, says);
    }
}

/// Messages said the wrong thing: `--sigma inf` was told "must be > 0"; a DP×CP study's
/// `cp = [0]` "does not divide" the GPUs; and `1e3` where an integer belongs was quoted back as
/// `1000.0`, a number the user never wrote. They now say what is required and quote the input
/// as written.
#[test]
fn messages_say_what_is_required_and_quote_the_input_as_written() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--sigma", "--mean", "--median"] {
        fcp()
            .args([
                "trace",
                "gen",
                "--source",
                "lognormal",
                "--docs",
                "3",
                flag,
                "inf",
            ])
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(format!(
                "{} must be finite and > 0, got inf",
                &flag[2..]
            )));
    }
    let dpcp = dir.path().join("d.toml");
    std::fs::write(
        &dpcp,
        "gpus = 8\ncp = [0]\ntokens_per_gpu = 1024\ntrace = \"default\"\n",
    )
    .unwrap();
    fcp().arg("dpcp").arg(&dpcp).assert().code(2).stderr(
        predicate::str::contains("cp must be ≥ 1").and(predicate::str::contains("divide").not()),
    );

    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            vec![
                "trace".into(),
                "stats".into(),
                file("t.jsonl", "{\"doc_lens\": [100, 1e3]}\n").into(),
            ],
            "line 1: document length `1e3` is not a whole number",
        ),
        (
            vec![
                "trace".into(),
                "stats".into(),
                file("t.json", "[100, 2.5E2]").into(),
            ],
            "element 1 (`2.5E2`) is not a whole number",
        ),
        (
            vec![
                "sweep".into(),
                file(
                    "s.toml",
                    "[grid]\ntraces = [\"default\"]\nschemes = [\"ring\"]\nranks = [1e3]\n",
                )
                .into(),
                "-o".into(),
                dir.path().join("sw").into(),
            ],
            "invalid type: floating point `1e3`, expected u32",
        ),
        (
            vec![
                "dpcp".into(),
                file(
                    "d2.toml",
                    "gpus = 8e0\ncp = [1]\ntokens_per_gpu = 1024\ntrace = \"default\"\n",
                )
                .into(),
            ],
            "invalid type: floating point `8e0`, expected u32",
        ),
    ];
    for (args, says) in cases {
        fcp()
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says).and(predicate::str::contains(".0`").not()));
    }
    let p = small_plan(dir.path());
    let text = std::fs::read_to_string(&p).unwrap();
    let f = file(
        "f.json",
        &text.replacen("\"len\":1024", "\"len\":1.024e3", 1),
    );
    fcp()
        .arg("verify")
        .arg(&f)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "documents[0].len: invalid type: floating point `1.024e3`, expected u64",
        ));
}

/// `fcp regress --tolerance 1e308` printed the tolerance as 309 digits; it prints `1e308` now,
/// with the helper that shows huge hardware values, and a short tolerance exactly as before.
#[test]
fn a_huge_regress_tolerance_is_printed_compactly() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("baseline.json");
    std::fs::write(
        &base,
        r#"{"version":1,"tolerance":0.03,"grid":{"batches":1,"grid":{"traces":["default"],
        "schemes":["zigzag"],"ranks":[2],"tokens_per_rank":[1024]}},"cells":[]}"#,
    )
    .unwrap();
    fcp()
        .args([
            "regress",
            "--quiet",
            "--update",
            "--tolerance",
            "1e308",
            "--baseline",
        ])
        .arg(&base)
        .assert()
        .success()
        .stdout(predicate::str::ends_with("(tolerance 1e308)\n"));
    fcp()
        .args(["regress", "--quiet", "--baseline"])
        .arg(&base)
        .assert()
        .success()
        .stdout(predicate::str::contains("within tolerance 1e308 of"));
    for (tol, says) in [
        ("0.05", "0.05"),
        ("0.00001", "0.00001"),
        ("1e9", "1000000000"),
    ] {
        fcp()
            .args(["regress", "--quiet", "--tolerance", tol, "--baseline"])
            .arg(&base)
            .assert()
            .success()
            .stdout(predicate::str::contains(format!(
                "within tolerance {says} of"
            )));
    }
    fcp()
        .args(["regress", "--quiet", "--tolerance=-1e308", "--baseline"])
        .arg(&base)
        .assert()
        .code(2)
        .stderr(predicate::str::diff(
            "error: --tolerance must be a number ≥ 0, got -1e308\n",
        ));
}

/// Regression (bug hunt): hardware, model and kernel files, plans, measurements and study
/// configs were read whole before parsing, so `/dev/zero` grew past 4 GB in five seconds;
/// every user file is now refused at its first NUL byte, naming what it should have been.
#[cfg(unix)]
#[test]
fn an_endless_binary_input_is_refused_at_once_wherever_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("p.json");
    fcp()
        .args(["plan", "--scheme", "ring", "--ranks", "2", "-o"])
        .arg(&plan)
        .assert()
        .success();
    let plan = plan.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["hw", "show", "--hardware", "/dev/zero"],
            "not a TOML hardware file",
        ),
        (
            vec!["hw", "show", "--hardware", "h100", "--model", "/dev/zero"],
            "not a TOML model file",
        ),
        (
            vec![
                "hw",
                "kernel",
                "--hardware",
                "h100",
                "--profile",
                "/dev/zero",
                "--q-len",
                "10",
            ],
            "not a CSV kernel profile",
        ),
        (vec!["simulate", "/dev/zero"], "not a JSON plan"),
        (
            vec!["validate", "--plan", &plan, "--measured", "/dev/zero"],
            "not a JSON measurement",
        ),
        (
            vec!["sweep", "/dev/zero", "-o", "never"],
            "not a TOML config",
        ),
        (vec!["dpcp", "/dev/zero"], "not a TOML config"),
    ];
    for (args, says) in cases {
        fcp()
            .current_dir(dir.path())
            .args(&args)
            .timeout(std::time::Duration::from_secs(30))
            .assert()
            .code(2)
            .stderr(predicates::str::contains(says));
    }
}

/// `fcp sweep --threads 100000` spent minutes setting up thread stacks, panicked in one and
/// hung; a count beyond 1024 (or 0) is now refused before anything is read or written.
#[test]
fn regression_a_sweep_with_a_hundred_thousand_threads_hung() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for n in ["100000", "0"] {
        fcp()
            .args([
                "sweep",
                "no-such-config.toml",
                "--quiet",
                "--threads",
                n,
                "-o",
            ])
            .arg(&out)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("1..=1024"));
        assert!(!out.exists());
    }
}

/// `fcp plot cdf --title $'a\x01b' -o x.svg` wrote an SVG that no XML parser reads (a control
/// character cannot be written in XML 1.0, escaped or not); the title is refused, nothing
/// written.
#[test]
fn regression_a_title_with_a_control_character_wrote_an_unreadable_svg() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.svg");
    fcp()
        .args(["plot", "cdf", "default", "--title", "a\u{1}b", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("U+0001"));
    assert!(!out.exists());
}

/// Regression (bug hunt): a range with a fourth number was refused as "trailing characters",
/// and a plan file holding an array or a number as "missing `version`".
#[test]
fn regression_malformed_ranges_and_plans_say_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_plan(dir.path());
    let long = edited_plan(dir.path(), &p, "long.json", |v| {
        v["ranks"][0]["owned"][0]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!(1))
    });
    fcp()
        .arg("verify")
        .arg(&long)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
        "ranks[0].owned[0]: invalid length 4, expected a token range: [doc, start, end], 3 numbers",
    ));
    let short = edited_plan(dir.path(), &p, "short.json", |v| {
        v["ranks"][0]["owned"][0].as_array_mut().unwrap().pop();
    });
    fcp()
        .arg("verify")
        .arg(&short)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "invalid length 2, expected a token range: [doc, start, end], 3 numbers",
        ));
    for (text, kind) in [("[]", "an array"), ("1", "a number"), ("null", "null")] {
        let f = dir.path().join("odd.json");
        std::fs::write(&f, text).unwrap();
        fcp()
            .arg("verify")
            .arg(&f)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!(
                "a plan is a JSON object (`{{\"version\": ..., \"ranks\": ...}}`), not {kind}"
            )));
    }
}
