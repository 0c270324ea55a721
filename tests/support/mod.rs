//! Helpers shared by the integration tests (each test file includes this module).
// Not every test file uses every helper.
#![allow(dead_code)]

use proptest::test_runner::Config as ProptestConfig;

/// The `fcp` binary under test.
pub fn fcp() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("fcp").expect("binary built")
}

/// The bundled H100 profile without the lines (fields and their sources) that start with
/// `prefix`, written to `path`: a profile written before a field existed, or one that leaves
/// it out.
pub fn h100_without(path: &std::path::Path, prefix: &str) -> String {
    let h100 = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/hardware/h100.toml"),
    )
    .unwrap();
    let without: String = h100
        .lines()
        .filter(|l| !l.starts_with(prefix))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, without).unwrap();
    h100
}

/// What `cmd` prints on stdout, once it has succeeded.
pub fn stdout_of(cmd: &mut assert_cmd::Command) -> String {
    String::from_utf8(cmd.assert().success().get_output().stdout.clone()).expect("UTF-8 output")
}

/// What `cmd` prints on stderr (its notes), once it has succeeded.
pub fn stderr_of(cmd: &mut assert_cmd::Command) -> String {
    String::from_utf8(cmd.assert().success().get_output().stderr.clone()).expect("UTF-8 output")
}

/// What `cmd` prints on stdout, parsed as JSON, and on stderr (its notes), once it has
/// succeeded.
pub fn json_and_stderr(cmd: &mut assert_cmd::Command) -> (serde_json::Value, String) {
    let out = cmd.assert().success().get_output().clone();
    let v = serde_json::from_slice(&out.stdout).expect("JSON output");
    (v, String::from_utf8(out.stderr).expect("UTF-8 output"))
}

/// What `cmd` prints on stdout, parsed as JSON, once it has succeeded.
pub fn json(cmd: &mut assert_cmd::Command) -> serde_json::Value {
    serde_json::from_str(&stdout_of(cmd)).expect("JSON output")
}

/// The merged `results.json` of `fcp sweep` run on the config `toml`, in a scratch directory.
pub fn sweep_results(toml: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sweep.toml");
    std::fs::write(&cfg, toml).unwrap();
    let out = dir.path().join("sweep");
    fcp()
        .args(["sweep", "-q"])
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap()
}

/// `fcp tpcp` on 16 GPUs of one 32K window with `scheme` alone: the small study the
/// end-to-end tests run.
pub fn tpcp_16(scheme: &str) -> [&str; 9] {
    [
        "tpcp",
        "--gpus",
        "16",
        "--context",
        "32768",
        "--batches",
        "1",
        "--schemes",
        scheme,
    ]
}

/// Plan the bundled trace's first batch with `scheme` on 4 ranks of 8,192 tokens, the model
/// split `tp` ways, into `DIR/SCHEME-tpTP.json`.
pub fn plan_with_tp(dir: &std::path::Path, scheme: &str, tp: u32) -> std::path::PathBuf {
    let out = dir.join(format!("{scheme}-tp{tp}.json"));
    fcp()
        .args(["plan", "--scheme", scheme, "--ranks", "4"])
        .args(["--tokens-per-rank", "8192", "--tp", &tp.to_string(), "-o"])
        .arg(&out)
        .assert()
        .success();
    out
}

/// Property-test budget: fewer cases and no shrinking on CI (fail fast), more locally (small
/// reproducers) — pubgrub's convention.
pub fn proptest_config() -> ProptestConfig {
    let ci = std::env::var_os("CI").is_some();
    ProptestConfig {
        cases: if ci { 48 } else { 96 },
        max_shrink_iters: if ci { 0 } else { 512 },
        ..ProptestConfig::default()
    }
}

/// Wait until `ready()` holds (polling every `poll`), the child exits, or `limit` passes; then
/// send SIGINT if the child is still running. Returns whether it was interrupted (a fast
/// machine may finish first, and the caller then checks the complete output instead).
pub fn interrupt_when(
    child: &mut std::process::Child,
    mut ready: impl FnMut() -> bool,
    poll: std::time::Duration,
    limit: std::time::Duration,
) -> bool {
    let t0 = std::time::Instant::now();
    while !ready() && t0.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(poll);
    }
    let interrupted = child.try_wait().unwrap().is_none();
    if interrupted {
        let status = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    interrupted
}
