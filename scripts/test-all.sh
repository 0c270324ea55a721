#!/usr/bin/env bash
# The full test suite: formatting, lints with warnings denied, every test.
# This is the README's test command; .ci/run calls it on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --doc --locked
# Regression gate: fixed small cells against the committed baseline (debug build, seconds).
# A deliberate change refreshes it: cargo run -- regress --baseline tests/regress/baseline.json --update
cargo run --locked --quiet -- regress --baseline tests/regress/baseline.json --quiet
# Benchmarks and examples run once in test mode (they must keep working).
cargo test --benches --examples --locked
# The executor (issue 10): installs PyTorch into .venv-replay/ and replays a plan of every
# scheme on 4 gloo processes against dense attention (docs/executor.md; ~2 min).
bash scripts/test-replay.sh
# Unit, property and end-to-end tests last, so the run closes on their summary.
cargo test --lib --bins --tests --locked
