//! End-to-end tests of `fcp trace ...`: generation, stats, packing, determinism, and that bad
//! input exits with code 2, names the line, and leaves no output file behind.

mod support;

use predicates::prelude::*;
use support::fcp;

#[test]
fn gen_then_stats() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.csv");
    fcp()
        .args([
            "trace", "gen", "--source", "magi", "--docs", "2000", "--seed", "3", "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("doc_len\n"));
    assert_eq!(text.lines().count(), 2001);

    let assert = fcp()
        .args(["trace", "stats", "--json"])
        .arg(&out)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&assert.get_output().stdout).unwrap();
    for k in [
        "docs", "tokens", "mean", "p50", "p90", "p99", "max", "above",
    ] {
        assert!(v.get(k).is_some(), "missing key {k}");
    }
    assert_eq!(v["docs"], 2000);
    let th: Vec<u64> = v["above"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["threshold"].as_u64().unwrap())
        .collect();
    assert_eq!(th, vec![4096, 32768, 131072]);

    fcp()
        .args(["trace", "stats"])
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("p99").and(predicate::str::contains("> 32768")));
}

#[test]
fn same_seed_same_bytes() {
    for source in [
        "lognormal",
        "magi",
        "wlb-llm",
        "prolong",
        "pile",
        "redpajama",
    ] {
        let run = |seed: &str| {
            fcp()
                .args([
                    "trace", "gen", "--source", source, "--docs", "300", "--seed", seed,
                ])
                .assert()
                .success()
                .get_output()
                .stdout
                .clone()
        };
        assert_eq!(run("5"), run("5"), "{source}");
        assert_ne!(run("5"), run("6"), "{source}");
    }
}

#[test]
fn default_trace_regenerates_byte_identically() {
    let out = fcp()
        .args([
            "trace", "gen", "--source", "wlb-llm", "--docs", "4000", "--seed", "1", "-o", "-",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let bundled =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/traces/default.csv")).unwrap();
    assert_eq!(out, bundled);
}

#[test]
fn unknown_source_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.csv");
    fcp()
        .args(["trace", "gen", "--source", "nope", "--docs", "10", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error: unknown source `nope`"));
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn lognormal_flags_on_other_sources_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.csv");
    fcp()
        .args(["trace", "gen", "--source", "magi", "--mean", "500", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("only to --source lognormal"));
    assert!(!out.exists());
}

#[test]
fn lognormal_flags_shape_the_output() {
    let assert = fcp()
        .args([
            "trace",
            "gen",
            "--source",
            "lognormal",
            "--median",
            "1000",
            "--sigma",
            "0.5",
            "--min",
            "200",
            "--max",
            "3000",
            "--docs",
            "3000",
        ])
        .assert()
        .success();
    let text = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
    let lens: Vec<u64> = text.lines().skip(1).map(|l| l.parse().unwrap()).collect();
    assert!(lens.iter().all(|&l| (200..=3000).contains(&l)));
    fcp()
        .args(["trace", "gen", "--source", "lognormal", "--sigma", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("sigma"));
}

#[test]
fn malformed_csv_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "doc_len\n100\n200\n-5\n").unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&bad)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("error: line 4"));
    std::fs::write(&bad, "doc_len,x\n100,1\n200\n").unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("line 3").and(predicate::str::contains("malformed")));
    std::fs::write(&bad, "length\n100\n").unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("doc_len"));
    std::fs::write(&bad, "doc_len\n").unwrap();
    fcp()
        .args(["trace", "stats"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("empty"));
}

#[test]
fn missing_file_exits_2() {
    fcp()
        .args(["trace", "stats", "/nonexistent/fcp/trace.csv"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "cannot read /nonexistent/fcp/trace.csv",
        ));
}

#[test]
fn stats_reads_jsonl_from_stdin() {
    fcp()
        .args(["trace", "stats", "-", "--json"])
        .write_stdin("{\"doc_lens\": [100, 5000]}\n{\"doc_lens\": [40000]}\n")
        .assert()
        .success()
        .stdout(
            predicate::str::contains("\"docs\": 3").and(predicate::str::contains("\"max\": 40000")),
        );
    fcp()
        .args(["trace", "stats", "-"])
        .write_stdin("{\"doc_lens\": [100]}\n{\"doc_lens\": [0]}\n")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("line 2"));
}

#[test]
fn pack_modes_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.csv");
    std::fs::write(&t, "doc_len\n3\n6\n25\n2\n").unwrap();
    let json = |mode: &str| {
        let a = fcp()
            .args([
                "trace",
                "pack",
                "--ranks",
                "2",
                "--tokens-per-rank",
                "4",
                "--context",
                "8",
            ])
            .args(["--pack", mode, "--json"])
            .arg(&t)
            .assert()
            .success();
        serde_json::from_slice::<serde_json::Value>(&a.get_output().stdout).unwrap()
    };
    let carry = json("carry");
    let total: u64 = carry["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 36);
    assert_eq!(carry["truncated"], 0);
    let budget = json("budget");
    assert_eq!(budget["truncated"], 1);
    assert_eq!(budget["batches"][0]["doc_lens"], serde_json::json!([3]));
    let window = json("window");
    assert_eq!(window["batches"][0]["doc_lens"], serde_json::json!([3, 5]));
    fcp()
        .args(["trace", "pack", "--ranks", "0", "--tokens-per-rank", "4"])
        .arg(&t)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("ranks must be greater than 0"));
}

/// `trace pack` takes `--context` with every packing mode (scripts pack a trace each way with
/// one command line), but where the mode ignores it, it says so instead of dropping it quietly
/// (`plan`, `compare` and the rest refuse it).
#[test]
fn pack_notes_a_context_that_the_mode_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.csv");
    std::fs::write(&t, "doc_len\n3\n6\n25\n2\n").unwrap();
    let run = |extra: &[&str]| {
        let a = fcp()
            .args(["trace", "pack", "--ranks", "2", "--tokens-per-rank", "4"])
            .args(extra)
            .arg(&t)
            .assert()
            .success();
        String::from_utf8(a.get_output().stderr.clone()).unwrap()
    };
    for mode in ["budget", "carry"] {
        let err = run(&["--context", "8", "--pack", mode]);
        assert!(
            err.contains(
                "--context applies only to --pack window or --pack wlb; ignored by --pack"
            ),
            "{mode}: {err}"
        );
        assert!(run(&["--pack", mode]).is_empty());
    }
    assert!(run(&["--context", "8", "--pack", "window"]).is_empty());
    assert!(run(&["--context", "8", "--pack", "wlb"]).is_empty());
}

/// `--pack wlb`: WLB-LLM's micro-batches of equal work, from the command line. With 8-token
/// windows, 2 micro-batches a step (16 tokens read), 16-token micro-batches and outliers from
/// 10 tokens: step 1 reads 3 and 6 and spreads them; the 25, cut to 16, is an outlier and
/// waits for a second one that never comes, so it is trained in the last step, after 9, 2 and
/// 9 have gone. Nothing is dropped but the cut; the flags are refused with other modes and
/// where they cannot work.
#[test]
fn wlb_pack_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.csv");
    std::fs::write(&t, "doc_len\n3\n6\n25\n2\n9\n9\n").unwrap();
    let pack = |extra: &[&str]| {
        fcp()
            .args([
                "trace",
                "pack",
                "--ranks",
                "2",
                "--pack",
                "wlb",
                "--context",
                "8",
            ])
            .args(extra)
            .arg(&t)
            .assert()
    };
    let a = pack(&["--wlb-group", "2", "--wlb-outlier", "10", "--json"]).success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    let lens: Vec<Vec<u64>> = v["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| serde_json::from_value(b["doc_lens"].clone()).unwrap())
        .collect();
    assert_eq!(
        lens,
        vec![vec![6], vec![3], vec![9], vec![2], vec![16], vec![9]]
    );
    assert_eq!(v["truncated"], 1);
    // The limit and the outlier threshold are the user's to set.
    let a = pack(&["--wlb-group", "2", "--wlb-max-len", "30", "--json"]).success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(v["truncated"], 0);
    // Refused: a limit under the window, zero settings, WLB flags with other modes.
    pack(&["--wlb-max-len", "7"])
        .code(2)
        .stderr(predicate::str::contains("shorter than the 8-token window"));
    pack(&["--wlb-group", "0"])
        .code(2)
        .stderr(predicate::str::contains("must be greater than 0"));
    fcp()
        .args(["trace", "pack", "--ranks", "2", "--wlb-group", "2"])
        .arg(&t)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--wlb-group applies only to --pack wlb",
        ));
}

/// `trace pack` streams a file (two passes, batches printed as they close) but packs stdin in
/// memory and pretty-prints the whole value; the two must agree byte for byte in every mode.
#[test]
fn streamed_pack_equals_in_memory_pack() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    fcp()
        .args(["trace", "gen", "--source", "pile", "--docs", "3000", "-o"])
        .arg(&trace)
        .assert()
        .success();
    let text = std::fs::read(&trace).unwrap();
    for mode in ["budget", "window", "carry", "wlb"] {
        for json in [false, true] {
            let args = [
                "--ranks",
                "2",
                "--tokens-per-rank",
                "4096",
                "--context",
                "9000",
                "--pack",
                mode,
            ];
            let json_flag: &[&str] = if json { &["--json"] } else { &[] };
            let streamed = fcp()
                .args(["trace", "pack"])
                .arg(&trace)
                .args(args)
                .args(json_flag)
                .assert()
                .success()
                .get_output()
                .stdout
                .clone();
            let in_memory = fcp()
                .args(["trace", "pack", "-"])
                .args(args)
                .args(json_flag)
                .write_stdin(text.clone())
                .assert()
                .success()
                .get_output()
                .stdout
                .clone();
            assert_eq!(streamed, in_memory, "{mode} json={json}");
            if json {
                let v: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
                assert!(v["batches"].as_array().unwrap().len() > 1);
            }
        }
    }
}

/// Regression (bug hunt): `cat t.csv | fcp trace pack /dev/stdin ...` opened the pipe once per
/// pass (probe, count, print), so a valid trace read as "trace is empty" or with a length for
/// its header. A file that is not a regular file is read once, as `-` is.
#[cfg(unix)]
#[test]
fn pack_reads_a_pipe_path_once() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    fcp()
        .args([
            "trace", "gen", "--source", "wlb-llm", "--docs", "3000", "-o",
        ])
        .arg(&trace)
        .assert()
        .success();
    let text = std::fs::read(&trace).unwrap();
    let pack = |file: &str, stdin: &[u8]| {
        fcp()
            .args([
                "trace",
                "pack",
                file,
                "--ranks",
                "8",
                "--tokens-per-rank",
                "32768",
            ])
            .write_stdin(stdin.to_vec())
            .assert()
            .success()
            .get_output()
            .stdout
            .clone()
    };
    let from_file = pack(trace.to_str().unwrap(), b"");
    assert_eq!(pack("/dev/stdin", &text), from_file);
    assert_eq!(pack("-", &text), from_file);
    assert_eq!(
        String::from_utf8(pack("/dev/stdin", b"doc_len\n5\n6\n")).unwrap(),
        "1 batches, 11 tokens, 0 truncated documents\nbatch     0:     2 docs         11 tokens\n"
    );
}

/// A streamed `trace pack` fails on a bad line before printing anything (its first pass
/// validates), and a streamed `trace stats` names the line.
#[test]
fn streamed_commands_reject_bad_lines_before_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.csv");
    let mut text = String::from("doc_len\n");
    for _ in 0..5000 {
        text.push_str("100\n");
    }
    text.push_str("-7\n");
    std::fs::write(&trace, text).unwrap();
    fcp()
        .args(["trace", "pack", "--ranks", "1", "--tokens-per-rank", "100"])
        .arg(&trace)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("line 5002"));
    fcp()
        .args(["trace", "stats"])
        .arg(&trace)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("line 5002"));
}

/// `trace gen` streams its output; the file and stdout forms are the same bytes.
#[test]
fn gen_to_file_equals_gen_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.csv");
    let args = [
        "trace", "gen", "--source", "wlb-llm", "--docs", "5000", "--seed", "9",
    ];
    fcp().args(args).arg("-o").arg(&out).assert().success();
    let stdout = fcp()
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(std::fs::read(&out).unwrap(), stdout);
}

/// Regression (bug hunt): `trace pack --model nosuch` passed without a word unless the
/// packing used the model, and under `--pack wlb` a model without its widths weighed
/// documents by attention alone, unsaid.
#[test]
fn trace_pack_reads_its_model_and_says_how_wlb_weighs() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.csv");
    std::fs::write(&t, "doc_len\n100\n300\n").unwrap();
    fcp()
        .args(["trace", "pack"])
        .arg(&t)
        .args(["--ranks", "2", "--model", "nosuch"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains("unknown model `nosuch`"));
    fcp()
        .args(["trace", "pack"])
        .arg(&t)
        .args(["--ranks", "2", "--model", "llama3-8b"])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "--model weighs documents in WLB packing only",
        ));
    let m = dir.path().join("m.toml");
    std::fs::write(
        &m,
        "name = \"m\"\nq_heads = 8\nkv_heads = 8\nhead_dim = 128\ndtype_bytes = 2\n",
    )
    .unwrap();
    fcp()
        .args(["trace", "pack"])
        .arg(&t)
        .args(["--ranks", "2", "--pack", "wlb", "--model"])
        .arg(&m)
        .assert()
        .success()
        .stderr(predicate::str::contains("by its attention alone"));
}

/// Regression (bug hunt): `fcp trace gen` had no `exponential`, so a sweep's
/// `gen:exponential:...` trace (the bundled dpcp study's) could not be written out. The file
/// it writes is the spec's trace: the same batches, the same figures.
#[test]
fn trace_gen_writes_a_sweep_s_exponential_trace() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("e.csv");
    fcp()
        .args(["trace", "gen", "--source", "exponential", "--mean", "1024"])
        .args(["--max", "8192", "--seed", "1", "--docs", "300", "-o"])
        .arg(&t)
        .assert()
        .success();
    let compare = |trace: &std::ffi::OsStr| {
        fcp()
            .args(["compare", "--ranks", "4", "--tokens-per-rank", "4096"])
            .args([
                "--batches",
                "2",
                "--schemes",
                "zigzag,fcp",
                "--json",
                "--trace",
            ])
            .arg(trace)
            .output()
            .unwrap()
    };
    let from_file = compare(t.as_os_str());
    let from_spec = compare("gen:exponential:mean=1024,max=8192,seed=1,docs=300".as_ref());
    assert!(from_file.status.success(), "{from_file:?}");
    assert_eq!(from_file.stdout, from_spec.stdout);
    fcp()
        .args(["trace", "gen", "--source", "exponential", "--sigma", "2"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "exponential takes --mean and --max",
        ));
}

/// Regression (bug hunt): `fcp plan --batch K` held the K batches before the one it plans, so
/// K past the last batch of a 2³²-token document carry-packed one token a batch ran out of
/// memory before saying it was out of range. Batch 2³² − 1 is the last; 2³² is refused.
#[test]
fn regression_plan_batch_k_holds_only_batch_k() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("huge.csv");
    std::fs::write(&trace, "doc_len\n4294967296\n").unwrap();
    let plan = |batch: &str| {
        let mut c = fcp();
        c.args([
            "plan",
            "--scheme",
            "fcp",
            "--ranks",
            "1",
            "--tokens-per-rank",
            "1",
        ])
        .args(["--pack", "carry", "--batch", batch, "-o", "-", "--trace"])
        .arg(&trace);
        c.assert()
    };
    let out = plan("4294967295").success();
    let p: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(p["batch_index"], 4294967295u64);
    plan("4294967296").code(2).stderr(predicates::str::contains(
        "--batch 4294967296 is out of range: the trace packs into 4294967296 batches",
    ));
}
