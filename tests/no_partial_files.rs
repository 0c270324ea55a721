//! No partial files (issue 11): every output is written to a temporary file and renamed, so a
//! command that fails — before writing, or at the very end when the rename itself fails — or
//! is interrupted leaves either the old file or the complete new one at the path, and never a
//! temporary file there.

mod support;

use std::path::Path;
use support::fcp;

const SENTINEL: &[u8] = b"old contents, must survive\n";

/// Hidden temporary files the atomic writer left in `dir`.
fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".fcp-"))
        .collect()
}

/// Commands that write `out`, each made to fail by bad input after it has started; the file
/// already at `out` must be untouched.
#[test]
fn a_failing_command_leaves_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("bad.json"), "{\"not\": \"a plan\"}").unwrap();
    std::fs::write(d.join("bad.csv"), "doc_len\n5\n0\n").unwrap();
    let cases: &[&[&str]] = &[
        &["trace", "gen", "--source", "nope", "-o", "out"],
        &["plan", "--scheme", "ulysses", "--ranks", "7", "-o", "out"],
        &["plan", "--scheme", "fcp", "--trace", "bad.csv", "-o", "out"],
        &["plot", "gantt", "bad.json", "-o", "out.png"],
        &["plot", "cdf", "bad.csv", "-o", "out.svg"],
    ];
    for args in cases {
        let out = d.join(args[args.len() - 1]);
        std::fs::write(&out, SENTINEL).unwrap();
        fcp().current_dir(d).args(*args).assert().code(2);
        assert_eq!(std::fs::read(&out).unwrap(), SENTINEL, "{args:?}");
        assert!(temps(d).is_empty(), "{args:?}: {:?}", temps(d));
    }
}

/// The output path is a directory that is not empty: the command is refused with the path in
/// the error, the directory stays as it was and no temporary file is left.
#[test]
fn a_failing_rename_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: &[&[&str]] = &[
        &[
            "trace", "gen", "--source", "magi", "--docs", "100", "-o", "taken",
        ],
        &["plan", "--scheme", "zigzag", "--ranks", "4", "-o", "taken"],
        &["plot", "cdf", "default", "-o", "taken.png"],
    ];
    for args in cases {
        let taken = d.join(args[args.len() - 1]);
        std::fs::create_dir_all(&taken).unwrap();
        std::fs::write(taken.join("keep"), SENTINEL).unwrap();
        fcp()
            .current_dir(d)
            .args(*args)
            .assert()
            .code(2)
            .stderr(predicates::str::contains("taken"));
        assert_eq!(std::fs::read(taken.join("keep")).unwrap(), SENTINEL);
        assert!(temps(d).is_empty(), "{args:?}: {:?}", temps(d));
    }
}

/// The bug: `-o /dev/null` renamed a temporary file over the null device, so the machine's
/// `/dev/null` became a regular file holding whatever was later thrown away (and cargo's
/// `rustc -` probe read that back as source). A path that is not a regular file (a device, a
/// named pipe) is written to directly and stays what it was.
#[cfg(unix)]
#[test]
fn dash_o_dev_null_keeps_the_device() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pipe = d.join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&pipe).status();
    assert!(made.map(|s| s.success()).unwrap_or(false), "mkfifo failed");
    let reader = {
        let pipe = pipe.clone();
        std::thread::spawn(move || std::fs::read(pipe).unwrap())
    };
    let gen = |out: &str| {
        let args = [
            "trace", "gen", "--source", "magi", "--docs", "100", "--seed", "3", "-o",
        ];
        fcp().current_dir(d).args(args).arg(out).assert().success();
    };
    gen("pipe");
    // Checked before joining: a replaced pipe would leave the reader blocked forever.
    let kind = std::fs::symlink_metadata(&pipe).unwrap().file_type();
    assert!(kind.is_fifo(), "the pipe was replaced by {kind:?}");
    let got = reader.join().unwrap();
    gen("file.csv");
    assert_eq!(got, std::fs::read(d.join("file.csv")).unwrap());
    assert!(temps(d).is_empty(), "{:?}", temps(d));
}

/// SIGINT while `fcp trace gen` streams a large trace: the path holds the old file or the
/// complete new one, never a prefix, and no temporary file is left.
#[cfg(unix)]
#[test]
fn sigint_leaves_the_old_file_or_the_complete_new_one() {
    use std::time::Duration;
    const DOCS: usize = 20_000_000;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("big.csv");
    std::fs::write(&out, SENTINEL).unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("fcp"))
        .current_dir(d)
        .args(["trace", "gen", "--source", "wlb-llm", "--seed", "1", "-o"])
        .arg(&out)
        .args(["--docs", &DOCS.to_string()])
        .spawn()
        .unwrap();
    // Interrupt once the temporary file has real data in it (mid-write).
    let mid_write = || {
        std::fs::read_dir(d).unwrap().flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with(".fcp-")
                && e.metadata().is_ok_and(|m| m.len() > 1 << 20)
        })
    };
    let interrupted = support::interrupt_when(
        &mut child,
        mid_write,
        Duration::from_millis(5),
        Duration::from_secs(60),
    );
    let status = child.wait().unwrap();
    eprintln!(
        "interrupted: {interrupted}, temporaries left: {:?}",
        temps(d)
    );
    let now = std::fs::read(&out).unwrap();
    if now != SENTINEL {
        // Only a finished run may replace the file, and then completely.
        assert!(status.success(), "{status:?} yet the file changed");
        let lines = now.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(lines, DOCS + 1);
    } else {
        assert!(interrupted, "the run finished without writing its output");
    }
    // Nor a temporary file: the handler removes it before the process dies of the signal.
    // Regression: Ctrl-C left a 35 MB `.fcp-*.tmp` behind.
    assert!(temps(d).is_empty(), "{:?}", temps(d));
    if interrupted && now == SENTINEL {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(2), "dies of SIGINT: {status:?}");
    }
}

/// `fcp trace gen -o /dev/stdout >> log` replaced the log with the trace: the link led to the
/// log file and the atomic writer renamed over it. A path naming a descriptor is appended to,
/// so `>>` adds to the log and `>` holds just the output.
#[cfg(unix)]
#[test]
fn dash_o_dev_stdout_appended_to_a_log_keeps_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let bin = assert_cmd::cargo::cargo_bin("fcp");
    let gen = |redirect: &str, log: &Path| {
        let script = format!(
            "'{}' trace gen --source magi --docs 3 --seed 1 -o /dev/stdout {redirect} '{}'",
            bin.display(),
            log.display()
        );
        let s = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .status();
        assert!(s.unwrap().success());
    };
    let trace = dir.path().join("trace.csv");
    gen(">", &trace);
    let trace = std::fs::read_to_string(&trace).unwrap();
    assert!(
        trace.starts_with("doc_len\n") && trace.lines().count() == 4,
        "{trace}"
    );
    let log = dir.path().join("log.txt");
    std::fs::write(&log, "before\n").unwrap();
    gen(">>", &log);
    gen(">>", &log);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("before\n{trace}{trace}")
    );
    assert!(temps(dir.path()).is_empty());
}

/// Regression (bug hunt): `fcp plan --all-batches` wrote `batch-00000.json`, then failed on
/// `batch-00001.json` (a directory took the name) and left the first plan behind.
#[test]
fn plan_all_batches_writes_every_plan_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("t.csv"), "doc_len\n3000\n1000\n500\n2500\n").unwrap();
    let run = |out: &str| {
        fcp()
            .current_dir(d)
            .args([
                "plan", "--scheme", "zigzag", "--trace", "t.csv", "--ranks", "2",
            ])
            .args(["--tokens-per-rank", "1000", "--all-batches", "-o", out])
            .assert()
    };
    std::fs::create_dir_all(d.join("taken/batch-00001.json")).unwrap();
    run("taken").code(2);
    let mut left: Vec<String> = std::fs::read_dir(d.join("taken"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["batch-00001.json"], "no plan and no temporary file");
    // (A new directory that could not be filled is removed again: `output::write_all_atomic`'s
    // own test.)
    run("new/plans").success();
    assert_eq!(std::fs::read_dir(d.join("new/plans")).unwrap().count(), 3);
}

/// Regression (bug hunt): a sweep that could not write `results.json` (a folder by that name)
/// had already replaced `results.csv`; the two are written all or nothing, as `dpcp` writes
/// its pair.
#[test]
fn a_sweep_writes_both_results_or_neither() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("t.csv"), "doc_len\n100\n300\n").unwrap();
    std::fs::write(
        d.join("s.toml"),
        "batches = 1\n[grid]\ntraces = [\"t.csv\"]\nschemes = [\"zigzag\"]\nranks = [2]\n",
    )
    .unwrap();
    let out = d.join("o");
    std::fs::create_dir_all(out.join("results.json")).unwrap();
    std::fs::write(out.join("results.csv"), SENTINEL).unwrap();
    fcp()
        .current_dir(d)
        .args(["sweep", "s.toml", "-o", "o", "-q"])
        .assert()
        .code(2);
    assert_eq!(std::fs::read(out.join("results.csv")).unwrap(), SENTINEL);
    assert!(temps(&out).is_empty(), "{:?}", temps(&out));
}
