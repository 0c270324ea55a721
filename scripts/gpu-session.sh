#!/usr/bin/env bash
# The executor's GPU check as one prepared session (issue 10, item 6): calibrate the local GPU,
# replay zigzag, FCP and FlashCP plans of 8 ranks × 32K tokens with Llama-3-70B shapes in
# single-GPU mode (each rank's compute in turn), and compare with the simulator.
#
# Three stages, because the GPU machine has PyTorch but no Rust toolchain and no network:
#
#   1. here (CPU):  bash scripts/gpu-session.sh prepare
#        plans the batch into .gpu-session/plans/ and 8 × 256-token plans of the same schemes
#        into .gpu-session/checks/ (git-ignored; small enough to travel).
#   2. GPU machine: bash scripts/gpu-session.sh device          (writes to $OUT, ≈ 4 min,
#        ≤ 520 s by its timeouts; the device tool must carry .gpu-session, which git ignores)
#        a preflight of PyTorch's FlashAttention against the reference (stops the session if
#        it fails: every later step runs on it, --backend sdpa), the check plans against dense
#        attention -> $OUT/checks.tar, calibrate.py (dense rows, written after each) ->
#        $OUT/kernels.csv, replay.py --single-device on the three plans in one launch ->
#        $OUT/<scheme>.measured.json, then 64K rows -> $OUT/kernels-long.csv as time allows;
#        log in $OUT/session.log. Uses the machine's python3 (its own PyTorch); no install.
#   3. here (CPU):  bash scripts/gpu-session.sh validate DIR   (DIR = the files from $OUT,
#        read-only is fine) writes h200-calibrated.toml (h200 with the calibrated kernel
#        table) to a temporary folder and runs `fcp validate` for each plan against it and
#        against the bundled h200 profile, and compares the 64K rows with what the lookup
#        says above the calibrated grid.
#
# Zigzag's 8 × 32K plan cuts into about 900 pieces a rank, most under 512 query rows; the replay
# runs a step's pieces as one varlen launch (scripts/fcp_exec/step.py), 9 a rank and pass, as
# the simulator prices them. Should this PyTorch's varlen op fail the preflight, the dense op
# runs piece by piece and zigzag's compute carries that dispatch (session.log says which).
#
# Aim: mean per-rank compute error ≤ 10% against the calibrated profile.
#
# Knobs, for the CPU rehearsal scripts/test-replay.sh runs of all three stages (defaults are
# the GPU session's): FCP (a built binary instead of `cargo run`), GPU_SESSION_DIR (instead of
# .gpu-session), GPU_SESSION_DEVICE=cpu (plain PyTorch in float32, no preflight),
# GPU_SESSION_HW (the bundled profile the plans are made with and validated against: h200, or
# h100 when the session ran on an H100), GPU_SESSION_TOKENS and GPU_SESSION_CHECK_TOKENS
# (tokens per rank of the timed and the checked plans), GPU_SESSION_LENS and GPU_SESSION_LONG
# (the calibration grid's lengths and the long rows' length), GPU_SESSION_HBM_MIB (the buffer
# the memory bandwidth is measured with).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
SCHEMES="zigzag fcp flashcp"
SESSION=${GPU_SESSION_DIR:-.gpu-session}
PLANS=$SESSION/plans
CHECKS=$SESSION/checks
MODEL=llama3-70b
HW=${GPU_SESSION_HW:-h200}
TOKENS=${GPU_SESSION_TOKENS:-32768}
CHECK_TOKENS=${GPU_SESSION_CHECK_TOKENS:-256}
LENS=${GPU_SESSION_LENS:-128,256,512,1024,2048,4096,8192,16384,32768}
LONG=${GPU_SESSION_LONG:-65536}
HBM_MIB=${GPU_SESSION_HBM_MIB:-2048}
case ${GPU_SESSION_DEVICE:-cuda} in
cuda) KERNELS=(--device cuda --backend sdpa --dtype bfloat16) ;;
cpu) KERNELS=(--device cpu --backend torch --dtype float32) ;;
*) echo "GPU_SESSION_DEVICE is cuda or cpu" >&2; exit 2 ;;
esac
fcp() {
    if [[ -n ${FCP:-} ]]; then "$FCP" "$@"; else cargo run --locked --quiet -- "$@"; fi
}

case "$stage" in
prepare)
    mkdir -p "$PLANS" "$CHECKS"
    for s in $SCHEMES; do
        fcp plan --scheme "$s" --ranks 8 --tokens-per-rank "$TOKENS" \
            --model "$MODEL" --hardware "$HW" -o "$PLANS/$s.json"
        # 8 × 256 tokens: small enough to check against dense attention on the GPU, in bf16
        # with the real head shapes, before any timing is trusted.
        fcp plan --scheme "$s" --ranks 8 --tokens-per-rank "$CHECK_TOKENS" \
            --model "$MODEL" --hardware "$HW" -o "$CHECKS/$s.json"
    done
    du -sh "$SESSION"
    echo "next: on the GPU machine, bash scripts/gpu-session.sh device"
    ;;
device)
    : "${OUT:?set OUT to the folder that receives the results}"
    PY=${PYTHON:-python3}
    log="$OUT/session.log"
    export PYTHONUNBUFFERED=1
    {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv || true
        "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
        start=$(date +%s)
        # Preflight (seconds): PyTorch's FlashAttention forward and backward against the plain
        # reference in bf16. Everything below runs on it (--backend sdpa, no fallback): if it
        # fails, stop now and keep the device time for a rerun, rather than time the plain
        # backend for minutes.
        if [[ ${GPU_SESSION_DEVICE:-cuda} == cuda ]]; then
            timeout 60 "$PY" - <<'PY'
import sys, torch
sys.path.insert(0, "scripts")
from fcp_exec.attention import choose_backend
# Exits non-zero when neither the varlen nor the dense op passes the self-test.
b = choose_backend("sdpa", torch.device("cuda"), torch.bfloat16, print)
print("preflight sdpa: ok,", b.name)
PY
            echo "preflight: $(( $(date +%s) - start )) s"
        fi
        # Correctness with the session's kernels: each scheme's 8 × 256-token plan against
        # dense attention, one launch. Their measured.json files travel back as one tar: the
        # device tool returns at most 8 files.
        ck=$(mktemp -d)
        timeout 60 "$PY" scripts/replay.py "$CHECKS"/*.json --single-device "${KERNELS[@]}" \
            --head-dim 128 --pass both --check yes --warmup 0 --iters 1 -o "$ck/checks" ||
            echo "checks failed (exit $?)"
        tar -C "$ck" -cf "$OUT/checks.tar" checks || true
        # Calibrate: fwd/bwd × causal/full over LENS, dense (the rows the simulator reads),
        # GQA 64:8 hd128. The CSV is rewritten after every row, so a timeout keeps what ran.
        t=$(date +%s)
        timeout 150 "$PY" scripts/calibrate.py -o "$OUT/kernels.csv" "${KERNELS[@]}" \
            --lens "$LENS" --varlen-docs 0 --q-heads 64 --kv-heads 8 --head-dims 128 \
            --warmup 2 --iters 5 --max-seconds 120 --hbm-mib "$HBM_MIB" || echo "calibrate failed (exit $?)"
        echo "calibrate: $(( $(date +%s) - t )) s"
        # The three timed plans, one launch (start-up paid once): <scheme>.measured.json each.
        t=$(date +%s)
        timeout 200 "$PY" scripts/replay.py "$PLANS"/*.json --single-device "${KERNELS[@]}" \
            --head-dim 128 --pass both --warmup 1 --iters 3 -o "$OUT" ||
            echo "replay failed (exit $?)"
        echo "replays: $(( $(date +%s) - t )) s"
        # Last, as time allows: rows above the grid's longest, to check what the lookup does
        # there (docs/kernel-profile.md § Lookup: causal tiles priced as 32K pieces).
        t=$(date +%s)
        timeout 50 "$PY" scripts/calibrate.py -o "$OUT/kernels-long.csv" "${KERNELS[@]}" \
            --lens "$LONG" --varlen-docs 0 --q-heads 64 --kv-heads 8 --head-dims 128 --warmup 1 \
            --iters 3 --max-seconds 35 || echo "calibrate $LONG failed (exit $?)"
        echo "calibrate $LONG: $(( $(date +%s) - t )) s"
        echo "device session: $(( $(date +%s) - start )) s"
    } 2>&1 | tee "$log"
    ;;
validate)
    dir=${2:?usage: gpu-session.sh validate DIR}
    [[ -f "$dir/kernels.csv" ]] || { echo "$dir/kernels.csv is missing" >&2; exit 2; }
    # The bundled h200 profile with its kernel table replaced by the calibrated one, written
    # outside DIR (the device tool hands its files back read-only), naming the table by its
    # absolute path.
    dir=$(cd "$dir" && pwd)
    [[ $dir != *$'\n'* ]] || { echo "$dir: a folder name with a line break cannot go in a TOML" >&2; exit 2; }
    # The path goes into a TOML string, through a sed replacement: escaped for both (bug
    # hunt: a folder named p&q wrote the matched line into the path).
    toml_dir=$(printf '%s' "$dir" | sed -e 's/[\\"]/\\&/g')
    sed_dir=$(printf '%s' "$toml_dir" | sed -e 's/[\\&|]/\\&/g')
    cal=$(mktemp -d)/$HW-calibrated.toml
    # The memory bandwidth calibrate.py measured (a 2 GiB copy), when it did: hbm_gbs.
    hbm=$(sed -n 's/^# hbm_gbs = \([0-9.]*\) .*/\1/p' "$dir/kernels.csv" | head -n 1)
    sed -e "s/^name = .*/name = \"$HW-calibrated\"/" \
        -e "s|^kernel_profile = .*|kernel_profile = \"$sed_dir/kernels.csv\"|" \
        ${hbm:+-e "/^\[sources\]/,\$!s|^hbm_gbs = .*|hbm_gbs = $hbm|"} \
        ${hbm:+-e "/^\[sources\]/,\$s|^hbm_gbs = .*|hbm_gbs = \"measured: scripts/calibrate.py --hbm-mib, $sed_dir/kernels.csv\"|"} \
        "configs/hardware/$HW.toml" >"$cal"
    echo "calibrated profile: $cal${hbm:+ (hbm_gbs $hbm GB/s measured)}"
    for s in $SCHEMES; do
        m="$dir/$s.measured.json"
        [[ -f $m ]] || { echo "no $m"; continue; }
        for hw in "$cal" "$HW"; do
            echo "== $s vs $hw"
            fcp validate --plan "$PLANS/$s.json" --measured "$m" --hardware "$hw" \
                --model "$MODEL" | tail -n 4
        done
    done
    # Above the table: the calibrated long rows against the lookup from the grid's rows.
    if [[ -f "$dir/kernels-long.csv" ]]; then
        echo "== $LONG, measured vs the lookup from the calibrated grid"
        for pass in fwd bwd; do
            for mask in causal full; do
                lookup=$(fcp hw kernel --hardware "$cal" --pass "$pass" --mask "$mask" \
                    --head-dim 128 --q-len "$LONG" --kv-len "$LONG" --json |
                    python3 -c 'import json, sys; print("%.4g" % json.load(sys.stdin)["tflops"])')
                measured=$(python3 - "$dir/kernels-long.csv" "$pass" "$mask" "$LONG" <<'PY'
import csv, sys
path, p, m, n = sys.argv[1:]
lines = [line for line in open(path) if not line.startswith("#")]
rows = [r for r in csv.DictReader(lines) if (r["pass"], r["mask"], r["varlen"], r["q_len"]) == (p, m, "false", n)]
print(f"{float(rows[0]['tflops']):.4g}" if rows else "not measured")
PY
                )
                echo "$pass $mask $LONG: lookup $lookup TFLOP/s, measured $measured"
            done
        done
    fi
    ;;
*)
    echo "usage: bash scripts/gpu-session.sh prepare | device | validate DIR" >&2
    exit 2
    ;;
esac
