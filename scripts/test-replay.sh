#!/usr/bin/env bash
# CPU replay tests (issue 10): installs PyTorch (scripts/setup-replay-env.sh), plans a small
# batch with every scheme `fcp` knows at N = 4, replays each plan forward and backward with 4
# processes on gloo and checks every rank's outputs and gradients against dense attention,
# replays one in single-device mode, checks that corrupted plans fail, that `fcp validate`
# reads what the replay wrote, and that calibrate.py's CPU dry run writes a profile fcp reads.
#
# Called by scripts/test-all.sh. FCP_SKIP_REPLAY=1 skips it (local development only: CI
# always runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${FCP_SKIP_REPLAY:-}" == 1 ]]; then
    echo "!!! FCP_SKIP_REPLAY=1: the executor's replay tests were SKIPPED !!!" >&2
    exit 0
fi
t0=$(date +%s)
PY=$(bash scripts/setup-replay-env.sh)
TORCHRUN="$(dirname "$PY")/torchrun"
t1=$(date +%s)
cargo build --locked --quiet
FCP="${CARGO_TARGET_DIR:-target}/debug/fcp"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
TRACE=tests/replay/tiny.csv
MODEL=tests/replay/tiny.toml
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

replay() { # replay PLAN... OUT [args...]: 4 processes on gloo; log in OUT.log
    local args=() out
    while [[ $# -gt 0 && $1 != --* ]]; do args+=("$1"); shift; done
    out=${args[-1]}
    unset 'args[-1]'
    "$TORCHRUN" --standalone --nproc_per_node 4 \
        scripts/replay.py "${args[@]}" -o "$out" --head-dim 8 "$@" >"$out.log" 2>&1
}

# Every scheme, from the CLI's own list (the error message of an unknown scheme names them).
schemes=$({ "$FCP" plan --scheme '?' --ranks 1 -o "$work/none.json" 2>&1 || true; } |
    sed -n 's/.*known: \(.*\))$/\1/p' | tr -d ',')
[[ -n "$schemes" ]] || { echo "could not list the schemes" >&2; exit 1; }
plans=()
for s in $schemes; do
    extra=()
    [[ $s == fcp ]] && extra=(--block 256)
    "$FCP" plan --scheme "$s" --trace "$TRACE" --model "$MODEL" --ranks 4 --tokens-per-rank 512 \
        "${extra[@]}" -o "$work/$s.json" >/dev/null
    plans+=("$work/$s.json")
done
# The node-level relay forwards K/V through a gateway rank (and its gradients back): only
# across nodes, so on a 2-GPU-per-node profile.
"$FCP" plan --scheme fcp:block=256,relay=true --hardware tests/replay/two-per-node.toml \
    --trace "$TRACE" --model "$MODEL" --ranks 4 --tokens-per-rank 512 -o "$work/fcp-relay.json" >/dev/null
# First hops sent a step ahead of their stage (`lookahead`, which `hybrid` uses): small blocks
# and no coalescing give enough stages for the early sends to matter.
"$FCP" plan --scheme fcp:block=128,coalesce=1,relay=true,lookahead=1 \
    --hardware tests/replay/two-per-node.toml --trace "$TRACE" --model "$MODEL" --ranks 4 \
    --tokens-per-rank 512 -o "$work/fcp-lookahead.json" >/dev/null
# Head-parallel nodes (`node_heads`, a `hybrid` candidate): FCP across the two nodes, the
# heads of each node's rows split over its two ranks (Q, K/V and outputs moved by head group).
"$FCP" plan --scheme fcp:block=256,node_heads=true,lookahead=1 \
    --hardware tests/replay/two-per-node.toml --trace "$TRACE" --model "$MODEL" --ranks 4 \
    --tokens-per-rank 512 -o "$work/fcp-node-heads.json" >/dev/null
# `hybrid` across two nodes, whichever candidate it picks (node grouping or head-parallel nodes).
"$FCP" plan --scheme hybrid --hardware tests/replay/two-per-node.toml \
    --trace "$TRACE" --model "$MODEL" --ranks 4 --tokens-per-rank 512 -o "$work/hybrid-2x2.json" >/dev/null
# `usp` across the two nodes: Ulysses groups of 2 (heads traded inside a node), a ring of 2
# across them whose hops carry one head group's K/V.
"$FCP" plan --scheme usp --hardware tests/replay/two-per-node.toml \
    --trace "$TRACE" --model "$MODEL" --ranks 4 --tokens-per-rank 512 -o "$work/usp-2x2.json" >/dev/null
# One launch replays every plan (process start-up and the dense reference are paid once).
ta=$(date +%s)
if replay "${plans[@]}" "$work/measured" --pass both; then rc=0; else rc=$?; fi
echo "replayed ${#plans[@]} plans in one 4-process launch in $(( $(date +%s) - ta )) s (exit $rc)"
for s in $schemes; do
    m="$work/measured/$s.measured.json"
    if [[ -f $m ]] && grep -q "^$s: .*PASS" "$work/measured.log"; then
        ok "replay $s (4 ranks, gloo, fwd+bwd): $(grep "^$s: " "$work/measured.log" | sed 's/; wrote.*//')"
    else
        bad "replay $s"
    fi
done
[[ $rc -eq 0 ]] || { tail -n 40 "$work/measured.log"; bad "replay launch exited $rc"; }
if "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); own={(c[0],c[1]):r["rank"] for r in p["ranks"] for c in r["owned"]}; sys.exit(0 if any(own.get((c[0],c[1]))!=t["src"] for t in p["transfers"] for c in t["ranges"]) else 1)' "$work/fcp-relay.json" &&
    replay "$work/fcp-relay.json" "$work/hybrid-2x2.json" "$work/fcp-lookahead.json" \
        "$work/fcp-node-heads.json" "$work/usp-2x2.json" "$work/relay" --pass both &&
    grep -q "^fcp: .*PASS; wrote .*fcp-relay" "$work/relay.log"; then
    ok "replay fcp:relay=true (2 nodes × 2, forwarded K/V, fwd+bwd): $(grep "^fcp: .*fcp-relay" "$work/relay.log" | sed 's/; wrote.*//')"
else
    bad "replay fcp:relay=true (forwarded K/V)"; tail -n 20 "$work/relay.log" 2>/dev/null || true
fi
if "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(0 if any(t["arrive_by"]-t["issue_at"]>1 for t in p["transfers"]) else 1)' "$work/fcp-lookahead.json" &&
    grep -q "^fcp: .*PASS; wrote .*fcp-lookahead" "$work/relay.log" 2>/dev/null; then
    ok "replay fcp:lookahead=1 (sends a step ahead, fwd+bwd): $(grep "^fcp: .*fcp-lookahead" "$work/relay.log" | sed 's/; wrote.*//')"
else
    bad "replay fcp:lookahead=1"
fi
if "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(0 if any(t["src"]//2!=t["dst"]//2 and t.get("heads") for t in p["transfers"]) and any(t["tensor"]=="out" for t in p["transfers"]) else 1)' "$work/fcp-node-heads.json" &&
    grep -q "^fcp: .*PASS; wrote .*fcp-node-heads" "$work/relay.log" 2>/dev/null; then
    ok "replay fcp:node_heads=true (heads split in each node, rails across, fwd+bwd): $(grep "^fcp: .*fcp-node-heads" "$work/relay.log" | sed 's/; wrote.*//')"
else
    bad "replay fcp:node_heads=true"
fi
if "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(0 if p["scheme"]["params"]["ring"]==2 and any(t.get("heads") and t.get("collective") is None for t in p["transfers"]) else 1)' "$work/usp-2x2.json" &&
    grep -q "^usp: .*PASS; wrote .*usp-2x2" "$work/relay.log" 2>/dev/null; then
    ok "replay usp (Ulysses in each node, a ring of head groups across, fwd+bwd): $(grep "^usp: .*usp-2x2" "$work/relay.log" | sed 's/; wrote.*//')"
else
    bad "replay usp (2 nodes × 2)"
fi
if grep -q "^hybrid: .*PASS" "$work/relay.log" 2>/dev/null; then
    ok "replay hybrid (2 nodes × 2, fwd+bwd): $(grep "^hybrid: " "$work/relay.log" | sed 's/; wrote.*//')"
else
    bad "replay hybrid (2 nodes × 2)"
fi

# fcp validate reads a real measured.json (CPU vs an H100 profile: the numbers only prove the
# plumbing; the accuracy aim is for GPU runs, scripts/gpu-session.sh).
# Hand-made plans that `fcp verify --numeric` accepts and the replay once failed
# (tests/replay/make-handmade.py): a send forwarding rows a collective brought at the same
# step (it found them missing), and a rank sending back rows its receiver owns (both ranks
# waited on each other until the gloo timeout). Then two the verifier once refused that the
# replay ran (bug hunt, hybrid and fcp --reshuffle plans edited by hand): outputs returned
# through another rank, and an input owner computing some of its own rows. And three the replay
# hung or aborted on: a forward waiting on a collective another rank's forward kept it from
# joining; a forward waiting on rows a call brings, while the call waits on this rank's join
# (which waited on a message still in flight); two calls of one step, the first waiting for
# data, that one rank joined in the other order. And three calls whose pieces forward data,
# which now go point to point (in the fixed order of calls they hung): one forwarding what
# another call of its step brings; one forwarding outputs a rank sends once a later call ran;
# one whose piece's rows also come round from the call itself (also held by halves of the
# heads). And two with outputs: one due early in a call a rank joins only past its last step
# (no step waits for outputs; the replay did, and hung), one whose call runs point to point
# (its piece left at its own later step, not at its rank's join, and took later outputs).
handmade="collective-forward echo out-detour input-owner-computes collective-join-first forward-waits-on-call calls-in-order
    call-feeds-call call-order-through-a-rank call-piece-held-twice call-piece-held-by-halves out-due-early
    out-piece-leaves-at-join"
for h in $handmade; do
    "$FCP" verify --numeric "tests/replay/$h.json" >/dev/null || bad "fcp verify tests/replay/$h.json"
done
if replay $(for h in $handmade; do echo "tests/replay/$h.json"; done) "$work/handmade" --pass both --timeout 60; then
    rc=0
else
    rc=$?
fi
for h in $handmade; do
    # A line per plan, named by the file it wrote (the hunted plans keep their scheme's name).
    if [[ $rc -eq 0 ]] && grep -q "PASS; wrote .*/$h\.measured\.json" "$work/handmade.log"; then
        ok "replay hand-made $h (fwd+bwd): $(grep "/$h\.measured\.json" "$work/handmade.log" | sed 's/; wrote.*//')"
    else
        bad "replay hand-made $h (exit $rc)"; tail -n 20 "$work/handmade.log"
    fi
done
# One launch holding several pieces of the same query rows, on heads that split a GQA group
# (tests/replay/make-handmade.py): the step's batched merge and the expanded K/V gradients
# against dense attention.
"$FCP" verify --numeric tests/replay/repeat-rows.json >/dev/null || bad "fcp verify tests/replay/repeat-rows.json"
if "$PY" scripts/replay.py tests/replay/repeat-rows.json --single-device --head-dim 8 --pass both \
    --check yes -o "$work/repeat-rows-m.json" >"$work/repeat-rows.log" 2>&1 &&
    grep -q "PASS" "$work/repeat-rows.log"; then
    ok "replay hand-made repeat-rows (fwd+bwd, single device): $(grep -o 'max rel error [^ ]*' "$work/repeat-rows.log")"
else
    bad "replay hand-made repeat-rows"; tail -n 20 "$work/repeat-rows.log"
fi
# A byte-order mark before the JSON is skipped, as fcp's readers skip it (docs/plan-format.md).
{ printf '\xef\xbb\xbf'; cat "$work/ring.json"; } >"$work/bom.json"
if "$PY" scripts/replay.py "$work/bom.json" --single-device --head-dim 8 -o "$work/bom-m.json" \
    >"$work/bom.log" 2>&1; then
    ok "replay reads a plan that starts with a byte-order mark"
else
    bad "replay of a plan with a byte-order mark"; cat "$work/bom.log"
fi

if "$FCP" validate --plan "$work/zigzag.json" --measured "$work/measured/zigzag.measured.json" \
    --model "$MODEL" --json >"$work/validate.json"; then
    ok "fcp validate on a replayed measured.json"
else
    bad "fcp validate on a replayed measured.json"
fi

# attention_time_ms is the simulator's: per pass the slowest rank's end, summed over passes
# (it was the largest per-rank sum, low whenever different ranks were slowest fwd and bwd).
if "$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); r=m["ranks"]; n=len(r[0]["passes"]); want=sum(max(x["passes"][i]["end_ms"] for x in r) for i in range(n)); sys.exit(0 if abs(m["attention_time_ms"]-want)<=1e-9*max(1,want) else 1)' \
    "$work/measured/fcp.measured.json"; then
    ok "measured attention_time_ms = Σ over passes of the slowest rank's end"
else
    bad "measured attention_time_ms is not Σ over passes of the slowest rank's end"
fi
# A measurement of another plan is refused, not compared (same rank count, other scheme).
if ! "$FCP" validate --plan "$work/zigzag.json" --measured "$work/measured/fcp.measured.json" \
    --model "$MODEL" >/dev/null 2>"$work/other-plan.log" &&
    grep -q "it measured .*fcp on 4 ranks), not this plan (zigzag" "$work/other-plan.log"; then
    ok "fcp validate refuses a measurement of another plan"
else
    bad "fcp validate compared a measurement of another plan"
fi
# Output paths are checked before anything runs: exit 2 and a message, not a traceback.
if "$PY" scripts/replay.py "$work/fcp.json" --single-device --head-dim 8 \
    -o "$work/no/such/dir/m.json" >"$work/bad-out.log" 2>&1; then rc=0; else rc=$?; fi
if [[ $rc -eq 2 ]] && grep -q "does not exist" "$work/bad-out.log" && ! grep -q Traceback "$work/bad-out.log"; then
    ok "replay refuses a missing output folder up front (exit 2)"
else
    bad "replay with a missing output folder exited $rc"; cat "$work/bad-out.log"
fi
# So are an empty -o, a folder where a second plan's measurement goes (the first plan used to
# replay and write its own first) and a tolerance that is not a finite number (a traceback
# after the replay).
mkdir -p "$work/outs/zigzag.measured.json"
refuses() { # refuses WHAT ARGS...: replay.py exits 2 before replaying anything, no traceback
    local what=$1 rc
    shift
    if "$PY" scripts/replay.py "$@" --single-device --head-dim 8 >"$work/bad-args.log" 2>&1; then rc=0; else rc=$?; fi
    if [[ $rc -eq 2 ]] && ! grep -q Traceback "$work/bad-args.log" && [[ ! -e "$work/outs/fcp.measured.json" ]]; then
        ok "replay refuses $what up front: $(head -n 1 "$work/bad-args.log")"
    else
        bad "replay with $what exited $rc"; cat "$work/bad-args.log"
    fi
}
refuses "an empty -o" "$work/fcp.json" -o ""
refuses "a folder where a second plan's measurement goes" "$work/fcp.json" "$work/zigzag.json" -o "$work/outs"
refuses "--tolerance nan" "$work/fcp.json" --tolerance nan -o "$work/tol.json"
refuses "--backend sdpa on the CPU" "$work/fcp.json" --backend sdpa --device cpu -o "$work/sdpa-cpu.json"

# Single-device mode: one process runs each rank's compute in turn.
if "$PY" scripts/replay.py "$work/fcp.json" --single-device --head-dim 8 -o "$work/fcp-single.json" \
    >"$work/single.log" 2>&1 && "$FCP" validate --plan "$work/fcp.json" \
    --measured "$work/fcp-single.json" --model "$MODEL" >/dev/null; then
    ok "single-device replay of fcp + validate: $(tail -n 1 "$work/single.log")"
else
    bad "single-device replay of fcp"; cat "$work/single.log"
fi
# FlashCP's plan is format version 2 (its all-gather lists each shard once, with `also_to`), as
# the GPU session replays it (scripts/gpu-session.sh).
if "$PY" scripts/replay.py "$work/flashcp.json" --single-device --head-dim 8 \
    -o "$work/flashcp-single.json" >"$work/single-flashcp.log" 2>&1 &&
    "$FCP" validate --plan "$work/flashcp.json" --measured "$work/flashcp-single.json" \
        --model "$MODEL" >/dev/null; then
    ok "single-device replay of flashcp (plan format 2) + validate: $(tail -n 1 "$work/single-flashcp.log")"
else
    bad "single-device replay of flashcp"; cat "$work/single-flashcp.log"
fi

# Corrupted plans must fail: a dropped transfer (data never arrives), a dropped receiver of an
# all-gather's multicast (`also_to`: that rank never gets the shard), a dropped task (the
# output misses a tile), a duplicated task (a tile counted twice).
corrupt() { # corrupt IN OUT WHAT
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
src, dst, what = sys.argv[1:4]
p = json.load(open(src))
if what == "drop-transfer":
    p["transfers"].pop(len(p["transfers"]) // 2)
elif what == "drop-receiver":
    next(t for t in p["transfers"] if t.get("also_to"))["also_to"].pop()
elif what == "drop-rows":
    # Rank 1 computes nothing for the rows of its first task's query range: those rows get no
    # output at all (an infinite error).
    r = p["ranks"][1]
    q0 = next(t for s in r["steps"] for t in s["tasks"])["q"]
    for s in r["steps"]:
        s["tasks"] = [t for t in s["tasks"] if t["q"] != q0]
elif what == "doc-out-of-range":
    p["transfers"][0]["ranges"][0][0] = len(p["documents"]) + 5
elif what == "heads-out-of-range":
    next(t for r in p["ranks"] for s in r["steps"] for t in s["tasks"])["heads"] = [0, p["q_heads"] + 1]
elif what == "kv-heads-split-group":
    next(t for t in p["transfers"] if t["tensor"] == "kv")["heads"] = [0, p["q_heads"] // p["kv_heads"] // 2]
elif what == "issued-after-due":
    t = p["transfers"][0]
    t["issue_at"] = t["arrive_by"] + 1
elif what == "unheld-document":
    p["documents"].append({"id": len(p["documents"]), "len": 50})
elif what == "extra-out":
    # An output return from a rank that computed none of those rows (bug hunt: zeros went out,
    # merged as nothing, and the replay said PASS).
    t = dict(next(t for t in p["transfers"] if t.get("tensor") == "out"))
    t["src"] = next(r for r in range(p["num_ranks"]) if r not in (t["src"], t["dst"]))
    p["transfers"].append(t)
else:
    steps = [s for r in p["ranks"] for s in r["steps"] if s["tasks"]]
    step = steps[len(steps) // 2]
    if what == "drop-task":
        step["tasks"].pop()
    else:
        step["tasks"].append(step["tasks"][0])
json.dump(p, open(dst, "w"))
PYEOF
}
for case in "ring drop-transfer" "llama3 drop-receiver" "zigzag drop-task" "flashcp duplicate-task" "usp extra-out"; do
    set -- $case
    corrupt "$work/$1.json" "$work/bad-$1-$2.json" "$2"
    if replay "$work/bad-$1-$2.json" "$work/bad-$1-$2-measured.json" --pass both; then
        bad "corrupted plan ($1, $2) replayed without error"
    else
        ok "corrupted plan ($1, $2) fails: $(grep -m1 -E '^error|FAIL' "$work/bad-$1-$2-measured.json.log" || true)"
    fi
done
# A range or head range outside the plan is refused before any rank runs (exit 2, no
# traceback; it used to be an IndexError mid-replay, or a PASS on one device). So are a
# transfer issued after it is due (the distributed replay deadlocked until the collective
# timeout) and a document no rank holds (the distributed replay never compared its rows and
# said PASS), and a K/V transfer naming part of a GQA group (it moved the whole K/V head while
# `fcp verify` read a part).
for what in doc-out-of-range heads-out-of-range kv-heads-split-group issued-after-due unheld-document; do
    corrupt "$work/ring.json" "$work/bad-ring-$what.json" "$what"
    if "$PY" scripts/replay.py "$work/bad-ring-$what.json" --single-device --head-dim 8 \
        -o "$work/bad-ring-$what-m.json" >"$work/bad-ring-$what.log" 2>&1; then rc=0; else rc=$?; fi
    if [[ $rc -eq 2 ]] && ! grep -q Traceback "$work/bad-ring-$what.log"; then
        ok "plan with a $what refused up front: $(head -n 1 "$work/bad-ring-$what.log")"
    else
        bad "plan with a $what: exit $rc"; cat "$work/bad-ring-$what.log"
    fi
done
# Malformed plan files and a seed past 64-bit seeding: exit 2 and a message, no traceback (bug
# hunt: each of these crashed with one, and a half step or an empty document replayed as PASS).
"$PY" - "$work/ring.json" "$work" <<'PYEOF'
import json, sys
src, work = sys.argv[1], sys.argv[2]
text = open(src).read()
def put(name, f):
    p = json.loads(text)
    f(p)
    json.dump(p, open(f"{work}/malformed-{name}.json", "w"))
put("task-not-object", lambda p: p["ranks"][0]["steps"][0]["tasks"].append(5))
put("transfer-not-object", lambda p: p["transfers"].append(5))
put("empty-document", lambda p: p["documents"].append({"id": len(p["documents"]), "len": 0}))
put("half-step", lambda p: p["transfers"][0].update(issue_at=0.5))
# What `fcp verify` refuses and the replay once ran in a reading of its own (bug hunt):
# `also_to` in a version-1 plan, uneven step counts, a collective carrying outputs and K/V.
def also_to_v1(p):
    t = p["transfers"][0]
    t["also_to"] = [next(r for r in range(p["num_ranks"]) if r not in (t["src"], t["dst"]))]
    p["version"] = 1
put("also-to-in-version-1", also_to_v1)
put("uneven-steps", lambda p: p["ranks"][0]["steps"].append({"tasks": []}))
def mixed(p):
    t = p["transfers"][0]
    t.update(kind="all_to_all", collective=7)
    p["transfers"].append(dict(kind="all_to_all", collective=7, tensor="out", src=t["dst"], dst=t["src"],
                               ranges=t["ranges"], issue_at=t["arrive_by"], arrive_by=t["arrive_by"]))
put("collective-both-ways", mixed)
open(f"{work}/malformed-huge-number.json", "w").write(text.replace('"issue_at":0', '"issue_at":1e400', 1))
open(f"{work}/malformed-not-utf8.json", "wb").write(b"\xff\xfe\x00garbage")
open(f"{work}/malformed-deep.json", "w").write("[" * 100000 + "]" * 100000)
PYEOF
for what in task-not-object transfer-not-object empty-document half-step also-to-in-version-1 uneven-steps \
    collective-both-ways huge-number not-utf8 deep seed; do
    plan="$work/malformed-$what.json" extra=()
    [[ $what == seed ]] && plan="$work/ring.json" extra=(--seed 20000000000000)
    if "$PY" scripts/replay.py "$plan" --single-device --head-dim 8 "${extra[@]}" \
        -o "$work/malformed-$what-m.json" >"$work/malformed-$what.log" 2>&1; then rc=0; else rc=$?; fi
    if [[ $rc -eq 2 ]] && ! grep -q Traceback "$work/malformed-$what.log" && [[ ! -e "$work/malformed-$what-m.json" ]]; then
        ok "malformed input ($what) refused: $(head -c 150 "$work/malformed-$what.log" | head -n 1)"
    else
        bad "malformed input ($what): exit $rc"; tail -n 5 "$work/malformed-$what.log"
    fi
done
# Rows left without any output read as an infinite error: the measurement is still JSON
# (`null`, failed; it used to be `Infinity`, which fcp validate could not read) and validate
# compares it with a warning.
# A plan whose waits close a cycle (`fcp verify`: Deadlock) is refused before any rank runs;
# it stalled every rank until the gloo timeout before.
if "$FCP" verify tests/replay/collective-deadlock.json >/dev/null 2>&1; then
    bad "fcp verify passed tests/replay/collective-deadlock.json"
fi
if "$PY" scripts/replay.py tests/replay/collective-deadlock.json --single-device --head-dim 8 \
    -o "$work/deadlock-m.json" >"$work/deadlock.log" 2>&1; then rc=0; else rc=$?; fi
if [[ $rc -eq 2 ]] && grep -q "cannot run to its end" "$work/deadlock.log" && [[ ! -e "$work/deadlock-m.json" ]]; then
    ok "a plan that cannot run to its end is refused up front: $(head -n 1 "$work/deadlock.log")"
else
    bad "a deadlocking plan: exit $rc"; cat "$work/deadlock.log"
fi
corrupt "$work/ring.json" "$work/bad-ring-rows.json" drop-rows
"$PY" scripts/replay.py "$work/bad-ring-rows.json" --single-device --head-dim 8 --pass fwd \
    -o "$work/bad-ring-rows-m.json" >"$work/bad-ring-rows.log" 2>&1 || true
# The corrupted plan does not verify, so its measurement is compared with the plan it was cut
# from: refused by the fingerprint (fewer tasks), and, without the fingerprint (as a file
# written before it), compared with the warning.
if "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1]))["check"]; sys.exit(0 if c["passed"] is False and c["max_rel_error"] is None else 1)' \
    "$work/bad-ring-rows-m.json" 2>/dev/null &&
    ! "$FCP" validate --plan "$work/ring.json" --measured "$work/bad-ring-rows-m.json" --model "$MODEL" \
        >/dev/null 2>"$work/bad-ring-rows-other.log" &&
    grep -q "18 tasks, 12 transfers), not this plan (ring for tiny-gqa: 1800 tokens in 2 documents, 20 tasks" \
        "$work/bad-ring-rows-other.log" &&
    "$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); del m["plan"]["fingerprint"]; json.dump(m, open(sys.argv[2], "w"))' \
        "$work/bad-ring-rows-m.json" "$work/bad-ring-rows-old.json" &&
    "$FCP" validate --plan "$work/ring.json" --measured "$work/bad-ring-rows-old.json" --model "$MODEL" \
        >/dev/null 2>"$work/bad-ring-rows-validate.log" &&
    grep -q "failed the dense check" "$work/bad-ring-rows-validate.log"; then
    ok "rows with no output: measured.json stays JSON (null, failed), validate refuses it for its plan's source by the fingerprint and warns without one"
else
    bad "rows with no output"; cat "$work/bad-ring-rows.log" "$work/bad-ring-rows-other.log" "$work/bad-ring-rows-validate.log" 2>/dev/null || true
fi
corrupt "$work/zigzag.json" "$work/bad-single.json" drop-task
if "$PY" scripts/replay.py "$work/bad-single.json" --single-device --head-dim 8 -o "$work/bad-single-m.json" \
    >"$work/bad-single.log" 2>&1; then
    bad "corrupted plan replayed on a single device without error"
else
    ok "corrupted plan fails on a single device"
fi

# The CUDA backends' calls (signatures, argument types, output shapes) on meta tensors: the CPU
# cannot run FlashAttention, and a call PyTorch refuses would otherwise first fail on the GPU.
if "$PY" - >"$work/meta.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, "scripts")
import torch
from fcp_exec.attention import SdpaAttention, SdpaVarlenAttention
m, cu = torch.device("meta"), [0, 96, 136, 160]
q = torch.empty(160, 8, 64, device=m, dtype=torch.bfloat16)
k = torch.empty(160, 2, 64, device=m, dtype=torch.bfloat16)
for b in (SdpaVarlenAttention(), SdpaAttention()):
    for causal in (False, True):
        o, lse = b.forward_varlen(q, k, k, cu, cu, causal, 0.125)
        dq, dk, dv = b.backward_varlen(q, k, k, q, lse, lse, cu, cu, causal, 0.125)
        got = [tuple(x.shape) for x in (o, lse, dq, dk, dv)]
        assert got == [(160, 8, 64), (160, 8), (160, 8, 64), (160, 2, 64), (160, 2, 64)], (b.name, got)
print("ok")
PY
then
    ok "sdpa-varlen and sdpa backends: calls and shapes on meta tensors"
else
    bad "sdpa backends on meta tensors"; cat "$work/meta.log"
fi
# The varlen backend's glue (offsets, GQA, both log-sum-exp layouts PyTorch has shipped) on CPU
# stand-ins for its two ops: the self-test and a replay against dense attention.
if "$PY" tests/replay/emulated_flash.py "$work" >"$work/emulated.log" 2>&1; then
    ok "sdpa-varlen on emulated ops: $(grep -c '^ok' "$work/emulated.log") lse layouts pass the self-test and the replay"
else
    bad "sdpa-varlen on emulated ops"; cat "$work/emulated.log"
fi
# calibrate.py on CPU: a tiny grid, and the CSV must load as a kernel profile.
if "$PY" scripts/calibrate.py --dry-run -o "$work/cpu-profile.csv" >"$work/calibrate.log" 2>&1 &&
    "$FCP" hw kernel --hardware h100 --profile "$work/cpu-profile.csv" --head-dim 16 --pass bwd --mask causal \
        --q-len 256 --kv-len 256 >"$work/hw-kernel.log" 2>&1; then
    ok "calibrate.py --dry-run writes a profile fcp reads: $(head -n 1 "$work/hw-kernel.log")"
else
    bad "calibrate.py --dry-run"; cat "$work/calibrate.log" "$work/hw-kernel.log" 2>/dev/null || true
fi

# A result path that is a special file is written to, not renamed over (the bug that turned
# /dev/null into a regular file): calibrate.py writes its profile into a named pipe.
mkfifo "$work/pipe"
cat "$work/pipe" >"$work/pipe.out" &
reader=$!
if "$PY" scripts/calibrate.py --dry-run -o "$work/pipe" >"$work/calibrate-pipe.log" 2>&1 &&
    [[ -p "$work/pipe" ]] && wait "$reader" && grep -q '^pass,mask' "$work/pipe.out"; then
    ok "calibrate.py -o <named pipe> writes through the pipe and keeps it"
else
    kill "$reader" 2>/dev/null || true
    bad "calibrate.py -o <named pipe>"; cat "$work/calibrate-pipe.log" || true
fi

# Bad calibration inputs are refused before the grid runs, not with a traceback after it (a
# missing output folder once cost a whole GPU calibration).
tiny="--device cpu --dtype float32 --q-heads 2 --kv-heads 1 --head-dims 16 --lens 64 --passes fwd --masks full --warmup 0 --iters 1"
for args in "--lens 64,128,64 -o $work/k.csv" "--masks full,full -o $work/k.csv" "-o $work/no/such/dir/k.csv" "--lens 64,abc -o $work/k.csv" "--varlen-docs 2,4 -o $work/k.csv" \
    "--passes fwd,bogus -o $work/k.csv" "--masks full,causal --kv-ratio 2 -o $work/k.csv" "--kv-ratio nan -o $work/k.csv" \
    "--hbm-mib -1 -o $work/k.csv"; do
    # shellcheck disable=SC2086
    if "$PY" scripts/calibrate.py $tiny $args >"$work/calibrate-bad.log" 2>&1 ||
        ! grep -q '^error: ' "$work/calibrate-bad.log" || grep -q Traceback "$work/calibrate-bad.log"; then
        bad "calibrate.py $args"; cat "$work/calibrate-bad.log"
    else
        ok "calibrate.py refuses $args up front: $(grep -m1 '^error: ' "$work/calibrate-bad.log")"
    fi
done

# Lengths that round to one varlen length (64 and 65 over 2 documents) are measured once: two
# rows of one series and length made a profile fcp refuses.
if "$PY" scripts/calibrate.py $tiny --lens 64,65 --varlen-docs 2 -o "$work/k-varlen.csv" \
    >"$work/calibrate-varlen.log" 2>&1 &&
    "$FCP" hw kernel --hardware h100 --profile "$work/k-varlen.csv" --head-dim 16 --pass fwd --mask full \
        --q-len 64 --kv-len 64 >/dev/null 2>>"$work/calibrate-varlen.log"; then
    ok "calibrate.py --varlen-docs 2 --lens 64,65 writes a profile fcp reads"
else
    bad "calibrate.py --varlen-docs 2 --lens 64,65"; cat "$work/calibrate-varlen.log"
fi

# --hbm-mib measures the memory bandwidth a profile's hbm_gbs gives (the optimizer step's
# rate): noted in the CSV's header, which fcp still reads as a kernel profile.
if "$PY" scripts/calibrate.py $tiny --hbm-mib 4 -o "$work/k-hbm.csv" >"$work/calibrate-hbm.log" 2>&1 &&
    grep -Eq '^# hbm_gbs = [0-9.]+ \(copy of 4 MiB' "$work/k-hbm.csv" &&
    "$FCP" hw kernel --hardware h100 --profile "$work/k-hbm.csv" --head-dim 16 --pass fwd --mask full \
        --q-len 64 --kv-len 64 >/dev/null 2>>"$work/calibrate-hbm.log"; then
    ok "calibrate.py --hbm-mib 4: $(grep -m1 '^# hbm_gbs' "$work/k-hbm.csv")"
else
    bad "calibrate.py --hbm-mib"; cat "$work/calibrate-hbm.log"
fi

# scripts/check-docs.py: a stale output is named (exit 1), `--update` rewrites it keeping the
# stderr a block shows and the CRLF endings, a second run finds nothing changed, and a
# command's output file lands in its scratch mirror, not in the checkout.
probe="docs/check-docs-probe-$$.csv"
printf '# t\r\n\r\n```sh\r\nfcp plan --scheme zigzag --ranks 2 --trace %s -o z.json\r\n```\r\n\r\n```\r\nz.json: stale\r\n```\r\n\r\n```sh\r\nfcp trace gen --source pile --seed 1 --docs 5 -o %s\r\n```\r\n\r\n```\r\n```\r\n' \
    "$PWD/$TRACE" "$probe" >"$work/cd.md"
if "$PY" scripts/check-docs.py --fcp "$FCP" "$work/cd.md" >"$work/cd1.log" 2>&1; then rc=0; else rc=$?; fi
if [[ $rc -eq 1 ]] && grep -q '^changed ' "$work/cd1.log" &&
    "$PY" scripts/check-docs.py --fcp "$FCP" --update "$work/cd.md" >"$work/cd2.log" 2>&1 &&
    "$PY" scripts/check-docs.py --fcp "$FCP" "$work/cd.md" >"$work/cd3.log" 2>&1 &&
    grep -q ', 0 changed' "$work/cd3.log" && grep -q $'^z.json: batch 0 .*\r$' "$work/cd.md" &&
    [[ ! -e "$probe" ]]; then
    ok "check-docs.py names a stale output, --update rewrites it (stderr and CRLF kept), writes nothing into the checkout"
else
    bad "check-docs.py"; cat "$work"/cd[123].log "$work/cd.md"; rm -f "$probe"
fi

# The GPU session rehearsed on the CPU, all three stages with their flags, paths and file
# names (plain PyTorch in float32, 8 × 64-token plans, lengths 32 and 64), so a change that
# breaks one fails here and not in the one GPU run. validate must not write into the folder
# the device tool hands back read-only.
gs="$work/gpu-session"
gsenv=(GPU_SESSION_DIR="$gs" FCP="$FCP" PYTHON="$PY" GPU_SESSION_DEVICE=cpu GPU_SESSION_TOKENS=64
    GPU_SESSION_CHECK_TOKENS=32 GPU_SESSION_LENS=32,64 GPU_SESSION_LONG=128 GPU_SESSION_HBM_MIB=8
    OUT="$gs/out")
mkdir -p "$gs/out"
if env "${gsenv[@]}" bash scripts/gpu-session.sh prepare >"$work/gs-prepare.log" 2>&1 &&
    env "${gsenv[@]}" bash scripts/gpu-session.sh device >"$work/gs-device.log" 2>&1 &&
    ! grep -q "failed (exit" "$work/gs-device.log" &&
    [[ $(grep -c "PASS; wrote .*/checks/" "$work/gs-device.log") -eq 3 ]] &&
    (cd "$gs/out" && find . | sort >"$work/gs-before") &&
    env "${gsenv[@]}" bash scripts/gpu-session.sh validate "$gs/out" >"$work/gs-validate.log" 2>&1 &&
    (cd "$gs/out" && find . | sort | cmp -s - "$work/gs-before") &&
    [[ $(grep -c "compute per rank: mean" "$work/gs-validate.log") -eq 6 ]] &&
    [[ $(grep -c "lookup .* TFLOP/s, measured [0-9]" "$work/gs-validate.log") -eq 4 ]] &&
    grep -Eq "^calibrated profile: .* \(hbm_gbs [0-9.]+ GB/s measured\)" "$work/gs-validate.log"; then
    ok "gpu-session.sh rehearsed on the CPU: prepare, device (checks pass, calibrate with hbm_gbs, replays, long rows), validate (6 comparisons against the measured hbm_gbs, DIR untouched)"
else
    bad "gpu-session.sh rehearsal"; cat "$work"/gs-*.log
fi

t2=$(date +%s)
echo "replay tests: install/check $((t1 - t0)) s, tests $((t2 - t1)) s"
echo "replay: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
