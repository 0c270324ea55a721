"""Format `fcp sweep` results as docs/results/beyond.md's tables (issue 8).

For every (hardware, trace, ranks) cell: each scheme's mean `vs_lower_bound` (attention time
over the lower bound, forward + backward), the best other scheme, and whether `hybrid` is no
slower than it. Reads the results.json files given on the command line.
"""
import json
import sys

OURS = "hybrid"
QUICK = "hybrid:quick=true"


def main(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows.extend(json.load(f))
    cells = {}
    schemes = []
    for r in rows:
        key = (r["hardware"], r["trace"].removeprefix("gen:").removesuffix(":seed=1"), r["ranks"])
        s = r["scheme"]
        if s not in schemes:
            schemes.append(s)
        if r.get("error"):
            cells.setdefault(key, {})[s] = None
            continue
        m = r["metrics"]
        cells.setdefault(key, {})[s] = (
            m["attention_time_ms"]["mean"],
            m["vs_lower_bound"]["mean"],
            m["lower_bound_ms"]["mean"],
            m["mean_compute_ms"]["mean"],
            m["max_compute_ms"]["mean"],
        )
    # Our own variants are neither "other" schemes nor in the comparison.
    others = [s for s in schemes if not s.startswith(OURS)]
    quick = QUICK in schemes
    for hw in sorted({k[0] for k in cells}):
        print(f"\n### {hw}\n")
        print(
            "| trace | N | " + " | ".join(others) + f" | **{OURS}** | best other | {OURS} ≤ best? |"
            + (f" {OURS} quick |" if quick else "")
        )
        print("|---|---|" + "---|" * (len(others) + 3 + quick))
        for key in sorted(k for k in cells if k[0] == hw):
            c = cells[key]
            fmt = lambda s: "–" if c.get(s) is None else f"{c[s][1]:.2f}"
            valid = [(c[s][0], s) for s in others if c.get(s) is not None]
            best_t, best_s = min(valid) if valid else (float("inf"), "–")
            mine = c.get(OURS)
            ok = "–" if mine is None else ("yes" if mine[0] <= best_t * (1 + 1e-9) else f"no ({mine[0] / best_t:.3f}×)")
            print(
                f"| {key[1]} | {key[2]} | "
                + " | ".join(fmt(s) for s in others)
                + f" | **{fmt(OURS)}** | {best_s} | {ok} |"
                + (f" {fmt(QUICK)} |" if quick else "")
            )

    # Where `hybrid`'s time goes: vs_lower_bound = efficiency × balance × exposure.
    print(f"\n### Where `{OURS}`'s time goes\n")
    print("`vs_lower_bound` = **efficiency** (mean rank compute / bound: what cutting and launches")
    print("cost) × **balance** (max / mean rank compute) × **exposure** (attention time / max rank")
    print("compute: communication and waiting not hidden). Means over the cell's batches.\n")
    print("| hardware | trace | N | vs_LB | efficiency | balance | exposure |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(cells):
        mine = cells[key].get(OURS)
        if mine is None:
            continue
        t, v, lb, mean_c, max_c = mine
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {v:.2f} | {mean_c / lb:.2f} | "
            f"{max_c / mean_c:.2f} | {t / max_c:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
