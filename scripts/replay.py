#!/usr/bin/env python3
"""Replay an fcp plan file with PyTorch and write measured.json (docs/executor.md).

Distributed (one process per plan rank, gloo on CPU, NCCL on GPU):
    torchrun --nproc_per_node 4 scripts/replay.py plan.json -o measured.json
One device (each rank's compute in turn, no communication), e.g. to calibrate on one GPU:
    python3 scripts/replay.py plan.json --single-device -o measured.json

Exit codes: 0 ran (and the check passed), 1 the plan could not be executed or its output
differs from dense attention, 2 bad input.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import warnings  # noqa: E402

# The executor needs no NumPy; PyTorch warns at import when it is absent.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

from fcp_exec.attention import choose_backend  # noqa: E402
from fcp_exec.output import write_text  # noqa: E402
from fcp_exec.plan import Plan, PlanError, rank_docs  # noqa: E402
from fcp_exec.runner import (  # noqa: E402
    Clock, Ctx, Data, PassTiming, distributed_pass, load_initial, prepare_backward, union_len,
)
from fcp_exec.step import backward as compute_backward  # noqa: E402
from fcp_exec.step import forward as compute_forward  # noqa: E402
from fcp_exec.store import ExecError, Store  # noqa: E402

# Documents at most this long in total are checked against dense attention by default.
CHECK_TOKENS = 16384


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plans", nargs="+", metavar="PLAN", help="plan file(s) written by `fcp plan`")
    ap.add_argument("-o", "--output", default="measured.json",
                    help="measured.json to write (rank 0); with several plans a directory that receives "
                         "PLAN-STEM.measured.json for each (one launch replays them all, sparing start-up)")
    ap.add_argument("--pass", dest="passes", choices=["fwd", "bwd", "both"], default="both",
                    help="passes to time; bwd runs an untimed forward first (default both)")
    ap.add_argument("--single-device", action="store_true",
                    help="one process: run each rank's compute in turn, no communication")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--backend", choices=["auto", "torch", "sdpa"], default="auto",
                    help="attention kernels: plain PyTorch, or PyTorch's FlashAttention (CUDA)")
    ap.add_argument("--dtype", choices=["auto", "float64", "float32", "bfloat16", "float16"], default="auto",
                    help="Q/K/V dtype (auto: float64 on CPU, bfloat16 on GPU)")
    ap.add_argument("--head-dim", type=int, default=0, help="head dimension (auto: 16 on CPU, 128 on GPU)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the generated Q, K, V and dO (0 to 2^32 - 1)")
    ap.add_argument("--check", choices=["auto", "yes", "no"], default="auto",
                    help=f"compare with dense attention (auto: when the batch has <= {CHECK_TOKENS} tokens)")
    ap.add_argument("--tolerance", type=float, default=0.0,
                    help="max error relative to the largest reference value (auto: 1e-9 float64, 1e-4 float32, 5e-2 16-bit)")
    ap.add_argument("--warmup", type=int, default=-1, help="untimed runs first (auto: 0 on CPU, 2 on GPU)")
    ap.add_argument("--iters", type=int, default=-1, help="timed runs; medians are reported (auto: 1 CPU, 5 GPU)")
    ap.add_argument("--collectives", choices=["auto", "p2p"], default="auto",
                    help="auto: a collective call spanning all ranks runs as one all_to_all_single; p2p: pieces go point to point")
    ap.add_argument("--timeout", type=int, default=300, help="seconds before a stuck collective fails")
    return ap.parse_args(argv)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def settings(a, plan):
    if a.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PlanError("--device cuda: no CUDA device is visible")
    gpu = device.type == "cuda"
    if a.backend == "sdpa" and not gpu:  # refused here, before any rank runs (exit 2, as --device cuda)
        raise PlanError("--backend sdpa needs a CUDA device (PyTorch's FlashAttention)")
    dtype = {"auto": torch.bfloat16 if gpu else torch.float64, "float64": torch.float64, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[a.dtype]
    # Each document's generator is seeded with seed · 1,000,003 + document, a signed 64-bit
    # number (a seed of 2·10^13 crashed with a traceback; bug hunt).
    if not 0 <= a.seed < 1 << 32:
        raise PlanError(f"--seed must be from 0 to {(1 << 32) - 1}, got {a.seed}")
    d = a.head_dim or (128 if gpu else 16)
    if d < 1:
        raise PlanError("--head-dim must be at least 1")
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    check = a.check == "yes" or (a.check == "auto" and plan.total_tokens() <= CHECK_TOKENS)
    if not (math.isfinite(a.tolerance) and a.tolerance >= 0):
        raise PlanError(f"--tolerance must be a finite number >= 0, got {a.tolerance}")
    tol = a.tolerance or {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 5e-2)
    warmup = a.warmup if a.warmup >= 0 else (2 if gpu else 0)
    iters = a.iters if a.iters >= 1 else (5 if gpu else 1)
    return device, dtype, acc, d, check, tol, warmup, iters


# ---------------------------------------------------------------- dense reference

_REFERENCE = {}


def reference(plan, data, doc, scale):
    """Cached `_reference`: plans of one batch share documents, and so their reference."""
    key = (plan.mask, plan.extent[doc], plan.q_heads, plan.kv_heads, data.d, data.seed, doc, str(data.dtype))
    if key not in _REFERENCE:
        _REFERENCE[key] = _reference(plan, data, doc, scale)
    return _REFERENCE[key]


def _reference(plan, data, doc, scale):
    """Dense attention of one document, independent of the executor's kernels: explicit
    scores, softmax and autograd in float64. Returns (o, lse, dq, dk, dv)."""
    q, k, v, do = (x.detach().to(torch.float64) for x in data.doc(doc))
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    g = plan.group
    s = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(g, 1)) * scale
    if plan.mask == "causal":
        E = q.shape[0]
        s = s.masked_fill(torch.ones(E, E, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v.repeat_interleave(g, 1))
    (o * do).sum().backward()
    return o.detach(), lse.detach().transpose(0, 1), q.grad, k.grad, v.grad


def check_store(plan, store, data, final, passes, scale, rank):
    """Largest error (relative to the largest reference value) over the rows this rank ends
    with; raises ExecError when an output or gradient row was left on a rank that does not
    hold it in the final layout (it would be missing from the merged result)."""
    worst = 0.0
    mine = {}
    for (doc, s, e) in final:
        mine.setdefault(doc, []).append((s, e))
    docs = set(mine) | set(store.docs("l")) | set(store.docs("dq")) | set(store.docs("dk"))
    for doc in sorted(docs):
        E = plan.extent[doc]
        keep = torch.zeros(E, dtype=torch.bool, device=store.device)
        for s, e in mine.get(doc, []):
            keep[s:e] = True
        l = store.get("l", doc)
        if bool(torch.isfinite(l[~keep]).any()):
            raise ExecError(f"rank {rank}: partial outputs of doc {doc} remain on a rank that does not hold them at the end")
        if "bwd" in passes:
            for name in ("dq", "dk", "dv"):
                if bool((store.get(name, doc)[~keep] != 0).any()):
                    raise ExecError(f"rank {rank}: {name} of doc {doc} was not returned to its holder")
        if doc not in mine:
            continue
        o_ref, l_ref, dq, dk, dv = reference(plan, data, doc, scale)
        rows = keep
        pairs = [(store.get("o", doc), o_ref), (l, l_ref)]
        if "bwd" in passes:
            pairs += [(store.get("dq", doc), dq), (store.get("dk", doc), dk), (store.get("dv", doc), dv)]
        for got, want in pairs:
            got, want = got[rows].to(torch.float64), want[rows]
            if want.numel() == 0:
                continue
            err = (got - want).abs()
            err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err).max().item()
            worst = max(worst, err / max(1.0, want.abs().max().item()))
    return worst


# ---------------------------------------------------------------- modes

def merge_iters(runs, with_comm):
    """Each pass's numbers from its median timed run: by end time, or by compute where there
    is none (single-device). One run's numbers add up — a pass's compute is its steps' sum and
    its end comes after its compute and waits, as `fcp validate` checks; medians taken number
    by number did not (bug hunt: a pass of 1024.0 ms whose steps summed to 994.2)."""
    out = []
    for p in range(len(runs[0])):
        js = [r[p].as_json(with_comm) for r in runs]
        key = "end_ms" if with_comm else "compute_ms"
        order = sorted(range(len(js)), key=lambda i: (js[i][key], i))
        out.append(js[order[(len(order) - 1) // 2]])
    return out


def rank_entry(rank, passes_json):
    s = lambda k: None if any(p[k] is None for p in passes_json) else sum(p[k] for p in passes_json)
    return {"rank": rank, "compute_ms": s("compute_ms"), "comm_ms": s("comm_ms"),
            "exposed_comm_ms": s("exposed_comm_ms"), "end_ms": s("end_ms"), "passes": passes_json}


def timed_names(passes):
    return ["fwd", "bwd"] if passes == "both" else [passes]


def run_single(a, plan, device, dtype, acc, d, check, tol, warmup, iters):
    backend = choose_backend(a.backend, device, dtype, log)
    scale = 1.0 / math.sqrt(d)
    clock = Clock(device)
    names = timed_names(a.passes)
    all_ranges = [(doc, 0, e) for doc, e in enumerate(plan.extent)]
    per_rank_runs = [[] for _ in range(plan.num_ranks)]
    worst = None
    data = Data(plan, d, a.seed, device, dtype, full=check)
    for it in range(warmup + iters):
        store = Store(plan, d, device, dtype, acc)
        load_initial(store, data, all_ranges)
        timings = [[PassTiming(n, plan.nsteps) for n in names] for _ in range(plan.num_ranks)]
        for which in ("fwd", "bwd"):
            if which == "bwd" and a.passes == "fwd":
                break
            if which == "bwd":
                prepare_backward(plan, store, data, all_ranges)
            compute = compute_forward if which == "fwd" else compute_backward
            for r in range(plan.num_ranks):
                tm = timings[r][names.index(which)] if which in names else PassTiming(which, plan.nsteps)
                for s, tasks in enumerate(plan.steps[r]):
                    t0 = clock.now()
                    compute(plan, store, backend, tasks, r, scale, check_have=False)
                    tm.compute[s] += clock.now() - t0
        if it >= warmup:
            for r in range(plan.num_ranks):
                per_rank_runs[r].append(timings[r])
        if check and it == warmup + iters - 1:
            worst = check_store(plan, store, data, all_ranges, names if a.passes != "fwd" else ["fwd"], scale, 0)
    ranks = [rank_entry(r, merge_iters(per_rank_runs[r], False)) for r in range(plan.num_ranks)]
    return backend, ranks, worst


def init_distributed(device, timeout):
    import datetime

    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=timeout))
    return Ctx(rank, world, timeout), device


def run_distributed(a, plan, ctx, device, dtype, acc, d, check, tol, warmup, iters):
    rank, world = ctx.rank, ctx.world  # main() checked world == plan.num_ranks for every plan
    backend = choose_backend(a.backend, device, dtype, log if rank == 0 else (lambda m: None))
    scale = 1.0 / math.sqrt(d)
    clock = Clock(device)
    names = timed_names(a.passes)
    data = Data(plan, d, a.seed, device, dtype, full=check)
    runs, worst = [], 0.0
    collectives = a.collectives == "auto"
    for it in range(warmup + iters):
        store = Store(plan, d, device, dtype, acc, rank_docs(plan, rank))
        load_initial(store, data, plan.initial[rank])
        timings = []
        for which in ("fwd", "bwd"):
            if which == "bwd" and a.passes == "fwd":
                break
            if which == "bwd":
                prepare_backward(plan, store, data, plan.initial[rank])
            tm = PassTiming(which, plan.nsteps)
            distributed_pass(plan, ctx, store, backend, data, which, collectives, clock, scale, tm,
                             check_have=it == 0)
            if which in names:
                timings.append(tm)
        if it >= warmup:
            runs.append(timings)
        if check and it == warmup + iters - 1:
            worst = check_store(plan, store, data, plan.initial[rank], names if a.passes != "fwd" else ["fwd"],
                                scale, rank)
    mine = rank_entry(rank, merge_iters(runs, True))
    gathered = gather_json([mine, worst], world, device)
    ranks = [g[0] for g in gathered]
    worst = max(g[1] for g in gathered) if check else None
    return backend, ranks, worst, rank


def gather_json(obj, world, device):
    """all_gather of a JSON-able object as bytes (all_gather_object would need numpy)."""
    import torch.distributed as dist
    raw = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8, device=device)
    n = torch.tensor([raw.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    top = max(int(x.item()) for x in sizes)
    padded = torch.zeros(top, dtype=torch.uint8, device=device)
    padded[: raw.numel()] = raw
    bufs = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(bufs, padded)
    return [json.loads(bytes(b[: int(k.item())].tolist()).decode()) for b, k in zip(bufs, sizes)]


def main(argv=None):
    a = parse_args(argv)
    try:
        plans = [Plan.load(p) for p in a.plans]
        outputs = output_paths(a.plans, a.output)
        device = settings(a, plans[0])[0]
        ctx = None
        if not a.single_device:
            world = int(os.environ.get("WORLD_SIZE", "0"))
            bad = [(p, pl.num_ranks) for p, pl in zip(a.plans, plans) if pl.num_ranks != world]
            if bad:
                path, n = bad[0]
                started = f"{world} processes were started" if world else "it was not started by torchrun"
                raise PlanError(f"{path} has {n} ranks but {started}; run `torchrun --nproc_per_node {n} "
                                f"scripts/replay.py ...`, or use --single-device")
            ctx, device = init_distributed(device, a.timeout)
        if len(plans) > 1:
            os.makedirs(a.output, exist_ok=True)
        code = 0
        for path, plan, out in zip(a.plans, plans, outputs):
            code = max(code, replay_one(a, path, plan, ctx, device, out))
        if ctx is not None:
            import torch.distributed as dist
            dist.destroy_process_group()
        return code
    except (PlanError, OSError) as e:
        log(f"error: {e}")
        return 2
    except ExecError as e:
        log(f"error: {e}")
        # Other ranks may be blocked on this one; torchrun stops them once this process exits.
        sys.stderr.flush()
        os._exit(1)


def output_paths(plans, output):
    """Where each plan's measurement goes, checked before anything runs (a bad path used to
    fail with a traceback after the whole replay; two plans named alike, ``a/p.json`` and
    ``b/p.json``, silently wrote one file)."""
    real = [os.path.realpath(p) for p in plans]
    if len(set(real)) != len(real):
        raise PlanError("a plan is named twice")
    if not output:
        raise PlanError("-o is empty: name the measured.json file (one plan) or a folder (several)")
    if len(plans) == 1:
        outs = [output]
        parent = os.path.dirname(output) or "."
        if os.path.isdir(output):
            raise PlanError(f"-o {output} is a directory; with one plan -o names the measured.json file")
        if not os.path.isdir(parent):
            raise PlanError(f"-o {output}: the folder {parent} does not exist")
    else:
        if os.path.exists(output) and not os.path.isdir(output):
            raise PlanError(f"-o {output} is a file; with several plans -o names a folder for their measured.json files")
        outs = [os.path.join(output, os.path.splitext(os.path.basename(p))[0] + ".measured.json") for p in plans]
        names = [os.path.basename(o) for o in outs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise PlanError(f"two plans would both write {output}/{twice[0]}: give the plan files different names")
        # Checked before any plan runs, not when its turn comes (bug hunt: the plans before it
        # had replayed and written theirs).
        for out in outs:
            if os.path.isdir(out):
                raise PlanError(f"{out} is a directory; the measurement of a plan is written there as a file")
    for out in outs:
        if os.path.realpath(out) in real:
            raise PlanError(f"the measurement would overwrite the plan {out}")
    return outs


def attention_time_ms(ranks):
    """The simulator's attention time: for each pass, when its slowest rank ended, summed over
    the passes (``src/sim/metrics.rs``). The largest per-rank sum read low whenever different
    ranks were slowest forward and backward. None without per-rank ends (single-device)."""
    ends = [[p["end_ms"] for p in r["passes"]] for r in ranks]
    if any(e is None for per_rank in ends for e in per_rank):
        return None
    return sum(max(per_rank[i] for per_rank in ends) for i in range(len(ends[0])))


def replay_one(a, path, plan, ctx, device, output):
    _, dtype, acc, d, check, tol, warmup, iters = settings(a, plan)
    if ctx is None:
        backend, ranks, worst = run_single(a, plan, device, dtype, acc, d, check, tol, warmup, iters)
        me = 0
    else:
        backend, ranks, worst, me = run_distributed(a, plan, ctx, device, dtype, acc, d, check, tol, warmup, iters)
    if me != 0:
        return 0 if worst is None or worst <= tol else 1
    single = a.single_device
    measured = {
        "format": "fcp-measured",
        "version": 1,
        "plan": {"path": path, "scheme": plan.scheme, "num_ranks": plan.num_ranks,
                 "model": plan.model, "hardware": plan.hardware, "fingerprint": plan.fingerprint},
        "mode": "single-device" if single else "distributed",
        "pass": a.passes,
        "time_unit": "ms",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": backend.name,
        "dtype": str(dtype).replace("torch.", ""),
        "head_dim": d,
        "torch": torch.__version__,
        "warmup": warmup,
        "iters": iters,
        "attention_time_ms": None if single else attention_time_ms(ranks),
        # A row with no output at all reads as an infinite error: null here (JSON has no
        # infinity; `Infinity` made the file unreadable to `fcp validate`), failed all the same.
        "check": {"ran": worst is not None,
                  "max_rel_error": worst if worst is None or math.isfinite(worst) else None,
                  "tolerance": tol, "passed": None if worst is None else worst <= tol},
        "ranks": ranks,
    }
    write_text(output, json.dumps(measured, indent=1, allow_nan=False) + "\n")
    total = sum(r["compute_ms"] for r in ranks)
    summary = f"{plan.scheme}: {plan.num_ranks} ranks, {measured['mode']}, {backend.name} {measured['dtype']} " \
              f"on {measured['device']}: compute {total:.2f} ms over all ranks"
    if measured["attention_time_ms"] is not None:
        summary += f", attention time {measured['attention_time_ms']:.2f} ms"
    if worst is not None:
        verdict = "PASS" if worst <= tol else "FAIL"
        summary += f"; check vs dense attention: max rel error {worst:.3g} (tolerance {tol:g}) {verdict}"
    print(summary + f"; wrote {output}", flush=True)
    return 0 if worst is None or worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
