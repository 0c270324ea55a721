"""What the batches of docs/results/beyond.md hold (issue 8): for every trace and group size,
the first budget-packed batch's documents, its longest document, and how much of the batch's
attention work (causal query-key pairs, the same on every profile) that one document is — in
rank shares, N × its pairs / all pairs. A document worth s rank shares cannot sit on fewer than
s ranks without one rank computing more than the balanced time, so its queries are cut into
pieces of about L/s rows and its K/V read across that many ranks (s/8 nodes).

    python3 scripts/beyond-docs.py FCP_BINARY
"""
import json
import subprocess
import sys
import tempfile

TRACES = ["lognormal", "magi", "pile", "prolong", "redpajama", "wlb-llm"]
RANKS = [16, 64, 256]
TPR = 32768


def pairs(n):
    return n * (n + 1) // 2


def main(fcp):
    print("| trace | N | documents | longest | largest document, rank shares | work in documents > 32K |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for trace in TRACES:
            path = f"{tmp}/{trace}.csv"
            subprocess.run([fcp, "trace", "gen", "--source", trace, "--seed", "1", "-o", path], check=True, capture_output=True)
            for n in RANKS:
                out = subprocess.run(
                    [fcp, "trace", "pack", path, "--ranks", str(n), "--tokens-per-rank", str(TPR), "--json"],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                lens = json.loads(out)["batches"][0]["doc_lens"]
                total = sum(pairs(l) for l in lens)
                longest = max(lens)
                shares = n * pairs(longest) / total
                long_work = sum(pairs(l) for l in lens if l > TPR) / total
                print(f"| {trace} | {n} | {len(lens)} | {longest} | {shares:.1f} | {long_work:.0%} |")


if __name__ == "__main__":
    main(sys.argv[1])
