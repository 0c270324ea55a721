"""WLB-LLM's packing against fixed windows, over many training steps (docs/results/wlb-packing.md).

For each packing (`window`: fixed context windows, FlashCP's; `wlb`: WLB-LLM's equal-work
micro-batches with outlier delay) and each micro-batch order, prices the first STEPS training
steps of a generated trace with `fcp compare --from-batch` (one step = --micro-batches windows
of a pipeline) and sums every step's tokens and time: tokens per GPU-second over the whole
stretch, as training sees it, not one step's. Also the tokens each packing drops.

    python3 scripts/wlb-packing.py [--fcp target/release/fcp] [--steps 24] > out.md

Deterministic: same binary and arguments, same output.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SCHEMES = ["zigzag", "wlb-llm", "hybrid"]


def run(fcp, args):
    out = subprocess.run([fcp, *args], check=True, capture_output=True, text=True)
    return out.stdout


def pack_flags(packing, context, group, ranks):
    """The packing flags of `fcp compare` and `fcp trace pack` for one row."""
    if packing == "budget":
        # Whole documents up to a window's tokens: FCP's packing, nothing cut.
        return ["--pack", "budget", "--tokens-per-rank", str(-(-context // ranks))]
    flags = ["--pack", packing.split("-")[0], "--context", str(context)]
    if packing.startswith("wlb"):
        flags += ["--wlb-group", str(group)]
    if packing == "wlb-1x":
        # Micro-batches no longer than the windows: the windows' memory.
        flags += ["--wlb-max-len", str(context)]
    return flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fcp", default="target/release/fcp")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--source", default="wlb-llm")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8)
    a = ap.parse_args()
    m = a.micro_batches
    gpus = a.ranks * a.tp * a.pp
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.csv")
        run(a.fcp, ["trace", "gen", "--source", a.source, "--docs", str(a.docs),
                    "--seed", "1", "-o", trace])
        total_tokens = json.loads(run(a.fcp, ["trace", "stats", trace, "--json"]))["tokens"]
        cmd = (f"fcp compare --trace T --ranks {a.ranks} --tp {a.tp} "
               f"--schemes {','.join(SCHEMES)} --layer --memory --pp {a.pp} "
               f"--micro-batches {m} --batches {m} --from-batch {m}·k")
        print(f"{a.steps} steps of {m} micro-batches · trace `gen:{a.source}:seed=1`, "
              f"{a.docs} docs · {a.ranks} CP × TP {a.tp} × PP {a.pp} = {gpus} GPUs · "
              f"h100 / llama3-70b · {a.context}-token windows\n")
        print(f"Each step: `{cmd}` with `--pack window --context {a.context}`, `--pack budget "
              f"--tokens-per-rank {-(-a.context // a.ranks)}` (whole documents up to a window's "
              f"tokens) or `--pack wlb --context {a.context} --wlb-group {m}` (wlb-1x: and "
              f"`--wlb-max-len {a.context}`), and "
              "`--micro-batch-order hill` for the hill rows.\n")
        print("| packing | order | tokens kept | steps that fit | " + " | ".join(
            f"{s} tok/s/GPU" for s in SCHEMES) + " | " + " | ".join(
            f"{s} step ms (max)" for s in SCHEMES) + " |")
        print("|---|---|---|---|" + "---|" * (2 * len(SCHEMES)))
        for packing in ["window", "budget", "wlb", "wlb-1x"]:
            packed = json.loads(run(a.fcp, ["trace", "pack", trace, "--ranks", str(a.ranks),
                                            *pack_flags(packing, a.context, m, a.ranks), "--json"]))
            kept = sum(b["tokens"] for b in packed["batches"])
            steps = min(a.steps, len(packed["batches"]) // m)
            for order in ["stream", "hill"]:
                tokens = {s: 0.0 for s in SCHEMES}
                time_ms = {s: 0.0 for s in SCHEMES}
                worst = {s: 0.0 for s in SCHEMES}
                fit = 0
                for k in range(steps):
                    args = ["compare", "--trace", trace, "--ranks", str(a.ranks), "--tp",
                            str(a.tp), *pack_flags(packing, a.context, m, a.ranks), "--schemes",
                            ",".join(SCHEMES), "--layer", "--memory", "--pp", str(a.pp),
                            "--micro-batches", str(m), "--batches", str(m), "--from-batch",
                            str(k * m), "--json"]
                    if order == "hill":
                        args += ["--micro-batch-order", "hill"]
                    rows = json.loads(run(a.fcp, args))
                    fit += all(r.get("footprint", {}).get("fits") for r in rows)
                    for row in rows:
                        st = row.get("step")
                        if row.get("error") or not st:
                            sys.exit(f"{row['scheme']} failed at step {k}: {row.get('error')}")
                        s = row["scheme"]
                        time_ms[s] += st["step_ms"]
                        tokens[s] += st["tokens_per_gpu_s"] * st["step_ms"] / 1000 * gpus
                        worst[s] = max(worst[s], st["step_ms"])
                tput = [tokens[s] / (time_ms[s] / 1000) / gpus for s in SCHEMES]
                print(f"| {packing} | {order} | {kept / total_tokens:.1%} | {fit}/{steps} | "
                      + " | ".join(f"{t:.0f}" for t in tput) + " | "
                      + " | ".join(f"{time_ms[s] / steps:.0f} ({worst[s]:.0f})"
                                   for s in SCHEMES) + " |")
        print("\n(tok/s/GPU: the steps' real tokens over their summed time per GPU; step ms: "
              "the mean step, and the slowest; tokens kept: of the trace's, by the whole "
              "packing — windows drop the rest of each document crossing a window's end; steps "
              "that fit: steps whose every scheme fits the GPU's memory at its fullest "
              "micro-batch, `fits` of `fcp compare --memory`)")
    print("\nRegenerate: `cargo build --release && python3 scripts/wlb-packing.py`. One "
          "command prices a row's whole stretch: `fcp compare` as above without `--batches` "
          "and `--from-batch`, with `--steps " + str(a.steps) + "` (its `step_ms`, `max_step` "
          "and `tok/s/GPU` columns are the row's figures; `tests/step_cli.rs` checks that "
          "the steps it prices are the ones `--from-batch` prices one at a time).")


if __name__ == "__main__":
    main()
