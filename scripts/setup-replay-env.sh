#!/usr/bin/env bash
# Creates .venv-replay/ (git-ignored) with the PyTorch the executor's CPU tests run on, and
# prints its python. Idempotent: a second run with the same pins only checks the import.
#
# Why this install: PyPI's Linux torch wheel is a CUDA build whose import loads the CUDA
# libraries, so `pip install --no-deps torch` fails at `import torch` (libcudart/libcublasLt
# missing) and the full install (~5 GB of nvidia-* wheels) is unavoidable without the PyTorch
# index, which this project's machines cannot reach. uv fetches and unpacks those wheels in
# parallel: measured on the 2-core CI machine with empty caches, 32 s (venv + uv + torch)
# against 70 s for `pip install torch` (3m40s while a cargo build shared the cores). Both
# pins are here so every machine replays with the same PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-replay
TORCH_PIN="torch==2.15.0"
UV_PIN="uv==0.13.9"
STAMP="$VENV/.fcp-pins"
want="$TORCH_PIN $UV_PIN"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && "$VENV/bin/python" -W ignore -c "import torch" 2>/dev/null; then
    echo "$VENV/bin/python"
    exit 0
fi
start=$(date +%s)
PY=${PYTHON:-python3}
rm -rf "$VENV"
"$PY" -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$UV_PIN" >&2
if ! "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" "$TORCH_PIN" >&2; then
    echo "setup-replay-env: uv failed; falling back to pip (slower)" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_PIN" >&2
fi
"$VENV/bin/python" -W ignore -c "import torch, torch.distributed as d; assert d.is_gloo_available()" >&2
echo "$want" > "$STAMP"
echo "setup-replay-env: installed $TORCH_PIN into $VENV in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
