//! Helpers shared by the integration tests (each test file includes this module).
// Not every test file uses every helper.
#![allow(dead_code)]

use proptest::test_runner::Config as ProptestConfig;

/// The `fcp` binary under test.
pub fn fcp() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("fcp").expect("binary built")
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
