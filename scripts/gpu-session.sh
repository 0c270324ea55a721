#!/usr/bin/env bash
# The executor's GPU check as one prepared session (issue 10, item 6): calibrate the local GPU,
# replay zigzag, FCP and FlashCP plans of 8 ranks × 32K tokens with Llama-3-70B shapes in
# single-GPU mode (each rank's compute in turn), and compare with the simulator.
#
# Three stages, because the GPU machine has PyTorch but no Rust toolchain and no network:
#
#   1. here (CPU):  bash scripts/gpu-session.sh prepare
#        plans the batch into .gpu-session/plans/ (git-ignored; small enough to travel).
#   2. GPU machine: bash scripts/gpu-session.sh device          (writes to $OUT, < 8 min;
#        the device tool must carry .gpu-session, which git ignores)
#        calibrate.py (bounded by --max-seconds) -> $OUT/kernels.csv, then
#        replay.py --single-device on each plan -> $OUT/<scheme>.measured.json, then 64K rows
#        -> $OUT/kernels-64k.csv as time allows; log in $OUT/session.log. Uses the machine's
#        python3 (its own PyTorch); no install.
#   3. here (CPU):  bash scripts/gpu-session.sh validate DIR   (DIR = the files from $OUT)
#        writes DIR/h200-calibrated.toml (h200 with the calibrated kernel table) and runs
#        `fcp validate` for each plan against it and against the bundled h200 profile, and
#        compares the 64K rows with what the lookup says above the calibrated grid.
#
# Aim: mean per-rank compute error ≤ 10% against the calibrated profile.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
SCHEMES="zigzag fcp flashcp"
PLANS=.gpu-session/plans
MODEL=llama3-70b
HW=h200

case "$stage" in
prepare)
    mkdir -p "$PLANS"
    for s in $SCHEMES; do
        cargo run --locked --quiet -- plan --scheme "$s" --ranks 8 --tokens-per-rank 32768 \
            --model "$MODEL" --hardware "$HW" -o "$PLANS/$s.json"
    done
    du -sh "$PLANS"
    echo "next: on the GPU machine, bash scripts/gpu-session.sh device"
    ;;
device)
    : "${OUT:?set OUT to the folder that receives the results}"
    PY=${PYTHON:-python3}
    log="$OUT/session.log"
    export PYTHONUNBUFFERED=1
    {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv || true
        "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
        start=$(date +%s)
        # Calibrate: fwd/bwd × causal/full × 512..32K, dense and varlen (4 docs), GQA 64:8 hd128.
        timeout 240 "$PY" scripts/calibrate.py -o "$OUT/kernels.csv" --q-heads 64 --kv-heads 8 \
            --head-dims 128 --warmup 2 --iters 5 --max-seconds 180
        echo "calibrate: $(( $(date +%s) - start )) s"
        for s in $SCHEMES; do
            t=$(date +%s)
            timeout 100 "$PY" scripts/replay.py "$PLANS/$s.json" --single-device --head-dim 128 \
                --pass both --warmup 1 --iters 3 -o "$OUT/$s.measured.json" ||
                echo "replay $s failed (exit $?)"
            echo "replay $s: $(( $(date +%s) - t )) s"
        done
        # Last, as time allows: 64K rows, above the grid's longest, to check what the lookup
        # does there (docs/kernel-profile.md § Lookup: causal tiles priced as 32K pieces).
        t=$(date +%s)
        timeout 50 "$PY" scripts/calibrate.py -o "$OUT/kernels-64k.csv" --lens 65536 \
            --varlen-docs 0 --q-heads 64 --kv-heads 8 --head-dims 128 --warmup 1 --iters 3 \
            --max-seconds 35 || echo "calibrate 64K failed (exit $?)"
        echo "calibrate 64K: $(( $(date +%s) - t )) s"
        echo "device session: $(( $(date +%s) - start )) s"
    } 2>&1 | tee "$log"
    ;;
validate)
    dir=${2:?usage: gpu-session.sh validate DIR}
    [[ -f "$dir/kernels.csv" ]] || { echo "$dir/kernels.csv is missing" >&2; exit 2; }
    # The bundled h200 profile with its kernel table replaced by the calibrated one (resolved
    # next to the TOML).
    sed -e 's/^name = .*/name = "h200-calibrated"/' \
        -e 's/^kernel_profile = .*/kernel_profile = "kernels.csv"/' \
        configs/hardware/h200.toml >"$dir/h200-calibrated.toml"
    for s in $SCHEMES; do
        m="$dir/$s.measured.json"
        [[ -f $m ]] || { echo "no $m"; continue; }
        for hw in "$dir/h200-calibrated.toml" "$HW"; do
            echo "== $s vs $hw"
            cargo run --locked --quiet -- validate --plan "$PLANS/$s.json" --measured "$m" \
                --hardware "$hw" --model "$MODEL" | tail -n 4
        done
    done
    # Above the table: the calibrated 64K rows against the lookup from the rows up to 32K.
    if [[ -f "$dir/kernels-64k.csv" ]]; then
        echo "== 64K, measured vs the lookup from the calibrated rows up to 32K"
        for pass in fwd bwd; do
            for mask in causal full; do
                lookup=$(cargo run --locked --quiet -- hw kernel --hardware "$dir/h200-calibrated.toml" \
                    --pass "$pass" --mask "$mask" --head-dim 128 --q-len 65536 --kv-len 65536 --json |
                    python3 -c 'import json, sys; print("%.1f" % json.load(sys.stdin)["tflops"])')
                measured=$(python3 - "$dir/kernels-64k.csv" "$pass" "$mask" <<'PY'
import csv, sys
path, p, m = sys.argv[1:]
lines = [line for line in open(path) if not line.startswith("#")]
rows = [r for r in csv.DictReader(lines) if (r["pass"], r["mask"], r["varlen"], r["q_len"]) == (p, m, "false", "65536")]
print(f"{float(rows[0]['tflops']):.1f}" if rows else "not measured")
PY
                )
                echo "$pass $mask 64K: lookup $lookup TFLOP/s, measured $measured"
            done
        done
    fi
    ;;
*)
    echo "usage: bash scripts/gpu-session.sh prepare | device | validate DIR" >&2
    exit 2
    ;;
esac
