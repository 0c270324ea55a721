#!/usr/bin/env bash
# Reproduces docs/results/ilp.md (FlashCP Table 2 setup: pile, N = 4, 128K context).
#
#   scripts/ilp-results.sh [FCP_BINARY] [BATCHES] [TIME_LIMIT_S]
#
# For each batch and each mode (objective with λ = 0.1; min-comm with R = 1.05), runs
# `fcp ilp --scheme flashcp --json` and prints one row, then the means.
set -euo pipefail
FCP=${1:-fcp}
BATCHES=${2:-20}
LIMIT=${3:-5}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
"$FCP" trace gen --source pile --docs 20000 --seed 0 -o "$DIR/pile.csv" >/dev/null
printf '%-9s %5s %9s %9s %9s %9s %8s %8s %10s %7s\n' mode batch h_imb ilp_imb h_save ilp_save gap% solve_s status items
for mode in objective min-comm; do
  for ((b = 0; b < BATCHES; b++)); do
    "$FCP" ilp --scheme flashcp --trace "$DIR/pile.csv" --ranks 4 --pack window --context 131072 \
      --model mha-16 --batch "$b" --mode "$mode" --lambda 0.1 --target-imbalance 1.05 \
      --granularity 1024 --time-limit "$LIMIT" --json >"$DIR/$mode-$b.json"
    jq -r --arg m "$mode" --arg b "$b" '[$m, $b, .heuristic.imbalance, .ilp.imbalance,
        100*.heuristic.comm_saving, 100*.ilp.comm_saving, 100*(.ilp.gap // 0), .ilp.solve_s,
        .ilp.status, .ilp.items] | @tsv' "$DIR/$mode-$b.json" |
      awk -F'\t' '{printf "%-9s %5s %9.4f %9.4f %8.1f%% %8.1f%% %8.2f %8.2f %10s %7s\n",$1,$2,$3,$4,$5,$6,$7,$8,$9,$10}'
  done
done
echo
echo "## means over $BATCHES batches"
printf '%-9s %9s %9s %9s %9s %8s %8s %8s\n' mode h_imb ilp_imb h_save ilp_save gap% solve_s optimal
for mode in objective min-comm; do
  jq -s -r --arg m "$mode" '[ (map(.heuristic.imbalance)|add/length), (map(.ilp.imbalance)|add/length),
      (map(.heuristic.comm_saving)|add/length*100), (map(.ilp.comm_saving)|add/length*100),
      (map(.ilp.gap // 0)|add/length*100), (map(.ilp.solve_s)|add/length),
      (map(select(.ilp.status=="optimal"))|length) ] | @tsv' "$DIR/$mode"-*.json |
    awk -F'\t' -v m="$mode" -v n="$BATCHES" '{printf "%-9s %9.4f %9.4f %8.1f%% %8.1f%% %8.2f %8.2f %5d/%d\n",m,$1,$2,$3,$4,$5,$6,$7,n}'
done
