#!/usr/bin/env bash
# Run every study in configs/studies/ and draw the plots docs/results/studies.md shows.
# Usage: bash scripts/run-studies.sh [OUT]   (default OUT=out/studies; PNGs go to docs/results/)
# Each sweep is resumable: rerunning after an interruption skips finished cells.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/studies}
PNG=docs/results
mkdir -p "$OUT" "$PNG"
cargo build --release --locked --quiet
fcp=target/release/fcp
[ -n "${CARGO_TARGET_DIR:-}" ] && fcp="$CARGO_TARGET_DIR/release/fcp"
t() {
  local name=$1; shift
  local s; s=$(date +%s%N)
  "$@"
  local ms=$(( ($(date +%s%N) - s) / 1000000 ))
  printf '%-22s %4d.%01d s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$OUT/times.txt"
}
: > "$OUT/times.txt"
for c in fcp-fig9-fig11 fcp-fig12-block flashcp-fig5 flashcp-fig7; do
  t "$c" "$fcp" sweep "configs/studies/$c.toml" -o "$OUT/$c" --quiet
done
t seed003-dpcp "$fcp" dpcp configs/studies/seed003-dpcp.toml -o "$OUT/seed003-dpcp" > "$OUT/seed003-dpcp.txt"
t seed003-dpcp-sim "$fcp" dpcp configs/studies/seed003-dpcp-sim.toml -o "$OUT/seed003-dpcp-sim" > "$OUT/seed003-dpcp-sim.txt"
t seed003-dpcp-layer "$fcp" dpcp configs/studies/seed003-dpcp-layer.toml -o "$OUT/seed003-dpcp-layer" > "$OUT/seed003-dpcp-layer.txt"

r=$OUT/fcp-fig9-fig11/results.json
"$fcp" plot imbalance "$r" -o "$PNG/fig9-compute-imbalance.png" \
  --title "Compute imbalance vs GPUs (FCP Fig. 9 setting, WLB-LLM lengths, 32K tokens/GPU)"
"$fcp" plot imbalance "$r" --metric comm_imbalance -o "$PNG/fig9-comm-imbalance.png" \
  --title "Communication imbalance vs GPUs (FCP Fig. 9 setting)"
"$fcp" plot scaling "$r" -o "$PNG/fig11-weak-scaling-mfu.png" \
  --title "Attention MFU, weak scaling at 32K tokens/GPU (FCP Fig. 11 setting)"
"$fcp" plot block "$OUT/fcp-fig12-block/results.json" -o "$PNG/fig12-block-size.png" \
  --title "FCP attention MFU vs block size, 128 GPUs (FCP Fig. 12 setting)"
"$fcp" plot lines "$OUT/flashcp-fig7/results.json" --x context --speedup-vs llama3 \
  -o "$PNG/flashcp-fig7-speedup.png" \
  --title "Training speedup over Llama3 CP vs context, 8 GPUs (FlashCP Fig. 7 setting)"
"$fcp" plot dpcp "$OUT/seed003-dpcp/dpcp.json" -o "$PNG/dpcp-max-over-min.png"
"$fcp" plot dpcp "$OUT/seed003-dpcp/dpcp.json" --metric cv -o "$PNG/dpcp-cv.png"
# The command docs/results/studies.md shows (it gives the figure its default title).
"$fcp" plot cdf gen:wlb-llm:seed=1 -o "$PNG/cdf-wlb-llm.png"
"$fcp" plan --scheme zigzag --ranks 8 --tokens-per-rank 16384 -o "$OUT/zigzag-8.json" > /dev/null
"$fcp" plan --scheme fcp --ranks 8 --tokens-per-rank 16384 -o "$OUT/fcp-8.json" > /dev/null
"$fcp" plot gantt "$OUT/zigzag-8.json" -o "$PNG/gantt-zigzag-8.png"
"$fcp" plot gantt "$OUT/fcp-8.json" -o "$PNG/gantt-fcp-8.png"
python3 scripts/studies-tables.py "$OUT" > "$OUT/tables.md"
echo "wrote $OUT/tables.md (the tables of docs/results/studies.md)"
cat "$OUT/times.txt"
