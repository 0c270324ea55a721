#!/usr/bin/env bash
# The full test suite: formatting, lints with warnings denied, every test.
# This is the README's test command; .ci/run calls it on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's first probe in a target dir runs `rustc -` with /dev/null as its input. On a machine
# where /dev/null has become a regular file (a program renamed a file over it, as
# `fcp -o /dev/null` did before src/output.rs stopped renaming over special files), rustc reads
# whatever was thrown away as source and the build fails with "failed to run `rustc` to learn
# about target-specific information". Restore the device when that is allowed; else empty the
# file before every step, since each step's build scripts write to it again.
devnull() {
    [[ -e /dev/null && ! -c /dev/null ]] || return 0
    if [[ -z "${FCP_DEVNULL_WARNED:-}" ]]; then
        echo "warning: /dev/null is not a character device; restoring it" >&2
        FCP_DEVNULL_WARNED=1
    fi
    if ! { mknod -m 666 /dev/.fcp-null c 1 3 && mv -f /dev/.fcp-null /dev/null; }; then
        rm -f /dev/.fcp-null
        echo "warning: cannot recreate /dev/null (needs CAP_MKNOD); emptying it instead" >&2
        : >/dev/null
    fi
}
step() { devnull; "$@"; }
step cargo fmt --all -- --check
step cargo clippy --all-targets --locked -- -D warnings
step cargo test --doc --locked
# Regression gate: fixed small cells against the committed baseline (debug build, seconds).
# A deliberate change refreshes it: cargo run -- regress --baseline tests/regress/baseline.json --update
step cargo run --locked --quiet -- regress --baseline tests/regress/baseline.json --quiet
# Benchmarks and examples run once in test mode (they must keep working).
step cargo test --benches --examples --locked
# The executor (issue 10): installs PyTorch into .venv-replay/ and replays a plan of every
# scheme on 4 gloo processes against dense attention (docs/executor.md; ~2 min).
step bash scripts/test-replay.sh
# Unit, property and end-to-end tests last, so the run closes on their summary.
step cargo test --lib --bins --tests --locked
