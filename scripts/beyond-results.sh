#!/usr/bin/env bash
# Regenerates the tables of docs/results/beyond.md (issue 8): every scheme's mean attention time
# (forward + backward) relative to the lower bound, per trace × ranks × hardware, with `hybrid`
# checked against the best other scheme of each cell.
#   bash scripts/beyond-results.sh [OUT_DIR]   (default out/beyond; resumable)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/beyond}"
cargo build --release --quiet
fcp=target/release/fcp
if [ -n "${CARGO_TARGET_DIR:-}" ]; then fcp="$CARGO_TARGET_DIR/release/fcp"; fi
"$fcp" sweep configs/studies/beyond.toml -o "$out/16-64" --quiet
"$fcp" sweep configs/studies/beyond-256.toml -o "$out/256" --quiet
python3 scripts/beyond-table.py "$out/16-64/results.json" "$out/256/results.json"
echo
echo "### What the batches hold"
echo
python3 scripts/beyond-docs.py "$fcp"
