#!/usr/bin/env python3
"""Print the tables of docs/results/studies.md from the sweeps `scripts/run-studies.sh` runs.

    python3 scripts/studies-tables.py OUT      (OUT: run-studies.sh's output folder)

Every number is a mean over the cell's batches as `fcp sweep` wrote it in results.json; the
speedups are one scheme's mean attention time over another's. Markdown on stdout, one table per
figure, in the page's order.
"""
import json
import sys
from collections import defaultdict


def load(out, study):
    with open(f"{out}/{study}/results.json") as f:
        return [c for c in json.load(f) if not c["error"] and c["metrics"]]


def mean(cell, metric):
    return cell["metrics"][metric]["mean"]


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x):
    return f"{100 * x:.1f}%"


def by_scheme_and_ranks(cells, metric, schemes):
    """Rows per scheme (in `schemes` order), a column per rank count, the metric in percent."""
    ranks = sorted({c["ranks"] for c in cells})
    at = {(c["scheme"], c["ranks"]): mean(c, metric) for c in cells}
    rows = [[s] + [pct(at[(s, n)]) if (s, n) in at else "–" for n in ranks] for s in schemes]
    return table(["scheme"] + [str(n) for n in ranks], rows)


def fig9_fig11(out):
    cells = load(out, "fcp-fig9-fig11")
    schemes = ["zigzag", "bytescale", "wlb-llm", "magi", "fcp"]
    print("### Fig. 9: compute imbalance\n")
    print(by_scheme_and_ranks(cells, "compute_imbalance", schemes))
    print("\n### Fig. 9: communication imbalance\n")
    print(by_scheme_and_ranks(cells, "comm_imbalance", schemes))
    print("\n### Fig. 11: attention MFU\n")
    print(by_scheme_and_ranks(cells, "mfu", schemes))


def fig12(out):
    cells = sorted(load(out, "fcp-fig12-block"), key=lambda c: c["block"])
    k = lambda b: f"{b // 1024}K"
    print("\n### Fig. 12: block size\n")
    print(
        table(
            ["block"] + [k(c["block"]) for c in cells],
            [
                ["MFU"] + [pct(mean(c, "mfu")) for c in cells],
                ["compute imbalance"] + [pct(mean(c, "compute_imbalance")) for c in cells],
                ["attention ms"] + [f"{mean(c, 'attention_time_ms'):.1f}" for c in cells],
            ],
        )
    )


def fig5(out):
    cells = load(out, "flashcp-fig5")
    schemes = ["llama3", "per-doc", "ring", "zigzag", "fcp", "flashcp"]
    t = {(c["trace"], c["model"], c["ranks"], c["scheme"]): mean(c, "attention_time_ms") for c in cells}
    rows, speedups = [], defaultdict(list)
    for trace in ["wlb-llm", "pile", "redpajama"]:
        for model in ["mha-16", "mha-32"]:
            for n in [4, 8]:
                key = (f"gen:{trace}:seed=1", model, n)
                base = t[key + ("llama3",)]
                row = [trace, model.split("-")[1], str(n)]
                for s in schemes:
                    row.append(f"{base / t[key + (s,)]:.2f}×")
                speedups["llama3"].append(base / t[key + ("flashcp",)])
                speedups["per-doc"].append(t[key + ("per-doc",)] / t[key + ("flashcp",)])
                rows.append(row)
    print("\n### FlashCP Fig. 5: speedup over Llama3 CP\n")
    print(table(["dataset", "H", "CP"] + schemes, rows))
    for b, xs in speedups.items():
        print(
            f"\nflashcp over {b}: mean {sum(xs) / len(xs):.2f}× over {len(xs)} cells, "
            f"range {min(xs):.2f}–{max(xs):.2f}×"
        )


def fig7(out):
    cells = load(out, "flashcp-fig7")
    contexts = sorted({c["context"] for c in cells})
    t = {(c["scheme"], c["context"]): mean(c, "attention_time_ms") for c in cells}
    rows = [
        [s] + [f"{t[('llama3', x)] / t[(s, x)]:.2f}×" for x in contexts]
        for s in ["llama3", "per-doc", "fcp", "flashcp"]
    ]
    print("\n### FlashCP Fig. 7: speedup over Llama3 CP vs context\n")
    print(table(["scheme"] + [f"{x // 1024}K" for x in contexts], rows))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    out = sys.argv[1]
    fig9_fig11(out)
    fig12(out)
    fig5(out)
    fig7(out)


if __name__ == "__main__":
    main()
