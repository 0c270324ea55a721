#!/usr/bin/env python3
"""Measure attention throughput on this device and write a kernel profile CSV in fcp's
kernels-profile/ format (docs/kernel-profile.md), rows stamped with the device, the library
versions and the date.

It times the same kernels scripts/replay.py runs (fcp_exec.attention, chosen the same way), so
a profile calibrated here and a replay measured there describe one implementation, and
`fcp validate` then tests the simulator's cost model and nothing else.

    python3 scripts/calibrate.py -o kernels.csv                       # GPU, default grid
    python3 scripts/calibrate.py --dry-run -o cpu.csv                 # tiny CPU grid (tests)

Grid: lengths (--lens), q:kv ratio (--kv-ratio; 1 = square tiles, which is what published
tables and the bundled profiles hold), heads and K/V heads (one profile per head shape: the
format has no head column), head dims, masks, passes, and varlen launches that split each
total length into --varlen-docs equal documents (len_kind `total`, varlen `true`).
FLOPs: 4 · allowed pairs · head_dim · q_heads forward, 2.5× that backward (the profile's
convention), so time = FLOPs / TFLOP/s holds without correction.
"""

import argparse
import datetime
import math
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

from fcp_exec.attention import choose_backend  # noqa: E402
from fcp_exec.output import cannot_write, write_text  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True, help="CSV to write")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny grid on the CPU in float32 (checks the pipeline, not a real profile)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--backend", choices=["auto", "torch", "sdpa"], default="auto")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--lens", default="512,1024,2048,4096,8192,16384,32768", help="tile lengths (q)")
    ap.add_argument("--kv-ratio", type=float, default=1.0, help="kv length = ratio × q length")
    ap.add_argument("--q-heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--masks", default="causal,full")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--varlen-docs", default="4",
                    help="document count of the varlen rows: one count (a profile keys varlen rows by "
                         "length alone); 0 or empty: none")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=0.0, help="stop the grid after this long (0: no limit)")
    ap.add_argument("--hbm-mib", type=int, default=0,
                    help="also measure memory bandwidth: copy a buffer of this many MiB (0: no), "
                         "a hardware profile's hbm_gbs, noted in the CSV's header")
    return ap.parse_args(argv)


def ints(s, flag):
    """The positive integers of a comma list; anything else is an error naming the flag."""
    out = []
    for x in s.split(","):
        x = x.strip()
        if not x:
            continue
        try:
            v = int(x)
        except ValueError:
            raise SystemExit(f"error: {flag}: {x!r} is not a whole number")
        if v > 0:
            out.append(v)
    return out


def pairs(mask, q, kv):
    """Allowed (q, k) pairs of a tile whose last query and key are aligned (causal)."""
    if mask == "full":
        return q * kv
    # Bottom-right aligned: query i (0-based) sees kv - q + i + 1 keys, clipped to [0, kv].
    return sum(min(kv, max(0, kv - q + i + 1)) for i in range(q)) if q != kv else q * (q + 1) // 2


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def run(self, fn, warmup, iters):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def measure_hbm(timer, device, mib, warmup, iters):
    """Memory bandwidth in GB/s: a device-to-device copy of `mib` MiB reads and writes every
    byte once, the access pattern of a fused optimizer step (docs/cost-model.md § Training
    step), so this is what a profile's `hbm_gbs` means."""
    n = mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    secs = timer.run(lambda: dst.copy_(src), warmup, iters)
    return 2 * n / secs / 1e9


def measure(backend, timer, device, dtype, hq, hk, d, mask, pas, docs, warmup, iters):
    """Median seconds of one launch over `docs` [(q_len, kv_len)], one varlen launch as the
    replay runs a step's pieces (fcp_exec.step); returns (seconds, FLOPs)."""
    # Generated on the device: the CPU's one-threaded randn took about 110 s of a GPU grid
    # (review before the first GPU session).
    gen = torch.Generator(device=device).manual_seed(11)
    mk = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=dtype)
    nq, nk = sum(q for q, _ in docs), sum(kv for _, kv in docs)
    q, k, v, do = mk(nq, hq, d), mk(nk, hk, d), mk(nk, hk, d), mk(nq, hq, d)
    cu_q, cu_k = [0], [0]
    for ql, kl in docs:
        cu_q.append(cu_q[-1] + ql)
        cu_k.append(cu_k[-1] + kl)
    scale = 1.0 / math.sqrt(d)
    causal = mask == "causal"
    flops = sum(4.0 * pairs(mask, ql, kl) * d * hq for ql, kl in docs) * (2.5 if pas == "bwd" else 1.0)
    if any(ql != kl for ql, kl in docs) and causal:
        raise SystemExit("error: causal rows need square tiles (--kv-ratio 1): the replay runs causal "
                         "pieces as squares on the diagonal")
    if pas == "fwd":
        fn = lambda: backend.forward_varlen(q, k, v, cu_q, cu_k, causal, scale)
    else:
        o, lse = backend.forward_varlen(q, k, v, cu_q, cu_k, causal, scale)
        delta = (do.float() * o.float()).sum(-1)
        fn = lambda: backend.backward_varlen(q, k, v, do, lse, delta, cu_q, cu_k, causal, scale)
    return timer.run(fn, warmup, iters), flops


def main(argv=None):
    a = parse_args(argv)
    if a.dry_run:
        # Its grid is its own: a flag that sets the grid was dropped without a word (bug hunt).
        defaults = vars(parse_args(["-o", a.output]))
        grid_flags = ("device", "dtype", "lens", "q_heads", "kv_heads", "head_dims", "varlen_docs",
                      "warmup", "iters")
        given = [f"--{k.replace('_', '-')}" for k in grid_flags if getattr(a, k) != defaults[k]]
        if given:
            raise SystemExit(f"error: --dry-run runs its own tiny CPU grid; drop {', '.join(given)}")
        a.device, a.dtype = "cpu", "float32"
        a.lens, a.q_heads, a.kv_heads, a.head_dims, a.varlen_docs = "64,128,256", 4, 2, "16", "2"
        a.warmup, a.iters = 1, 2
    if a.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device is visible")
    if device.type == "cpu" and not a.dry_run:
        print("warning: calibrating on the CPU; the profile describes this CPU, not a GPU", file=sys.stderr)
    if a.q_heads < 1 or a.kv_heads < 1 or a.q_heads % a.kv_heads:
        raise SystemExit("error: --q-heads must be a positive multiple of --kv-heads")
    if not (math.isfinite(a.kv_ratio) and a.kv_ratio > 0):
        raise SystemExit("error: --kv-ratio must be a finite positive number")
    # Every pass and mask, and the causal rows' square tiles, checked before the grid runs (bug
    # hunt: a bad entry late in the list was refused after the rows before it were measured).
    passes = [p for p in a.passes.split(",") if p]
    masks = [m for m in a.masks.split(",") if m]
    for p in passes:
        if p not in ("fwd", "bwd"):
            raise SystemExit(f"error: unknown pass {p!r}")
    for m in masks:
        if m not in ("causal", "full"):
            raise SystemExit(f"error: unknown mask {m!r}")
    if "causal" in masks and a.kv_ratio != 1:
        raise SystemExit("error: causal rows need square tiles (--kv-ratio 1): the replay runs causal "
                         "pieces as squares on the diagonal; calibrate them with --masks full")
    if a.iters < 1 or a.warmup < 0:
        raise SystemExit("error: --iters must be at least 1 and --warmup at least 0")
    if not (math.isfinite(a.max_seconds) and a.max_seconds >= 0):
        raise SystemExit(f"error: --max-seconds {a.max_seconds}: give seconds ≥ 0 (0: no limit)")
    # Checked before the grid runs: a bad path used to fail after the whole (GPU) calibration.
    if not a.output:
        raise SystemExit("error: -o is empty: name the profile CSV to write")
    why = cannot_write(a.output)
    if why:
        raise SystemExit(f"error: -o {a.output}: {why}")
    dtype = getattr(torch, a.dtype)
    backend = choose_backend(a.backend, device, dtype, lambda m: print(m, file=sys.stderr))
    timer = Timer(device)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    versions = f"torch {torch.__version__}"
    if device.type == "cuda":
        versions += f" cuda {torch.version.cuda}"
    today = datetime.date.today().isoformat()
    lens, dims = ints(a.lens, "--lens"), ints(a.head_dims, "--head-dims")
    if not lens or not dims:
        raise SystemExit("error: --lens and --head-dims need at least one positive value")
    # A value given twice made two rows of one series and length: a profile fcp refuses ("same
    # series and length"), found only after the whole grid had run (bug hunt).
    for flag, vals in (("--lens", lens), ("--head-dims", dims), ("--passes", passes), ("--masks", masks)):
        twice = sorted({v for v in vals if vals.count(v) > 1})
        if twice:
            raise SystemExit(f"error: {flag} lists {', '.join(map(str, twice))} more than once")
    # fcp keys a row by its geometric-mean length rounded to whole tokens (src/hardware/
    # kernel.rs, `length().round()`): two dense lengths that round alike under --kv-ratio made
    # a profile fcp refuses (bug hunt: 100 and 101 at ratio 0.25, both 50).
    keys = {}
    for L in lens:
        key = math.floor(math.sqrt(L * max(1, round(L * a.kv_ratio))) + 0.5)
        if key in keys:
            raise SystemExit(f"error: --lens {keys[key]} and {L} at --kv-ratio {a.kv_ratio} both make "
                             f"tiles of length {key} (the geometric mean fcp keys rows by): drop one")
        keys[key] = L
    vdocs = ints(a.varlen_docs, "--varlen-docs") if a.varlen_docs else []
    if len(vdocs) > 1:
        # Two counts give two rows of one (pass, mask, head_dim, varlen, length): a profile fcp
        # refuses ("same series and length"). Calibrate each count into its own file.
        raise SystemExit("error: --varlen-docs takes one document count per profile (fcp keys varlen rows "
                         "by length alone); run once per count with its own -o")
    if a.hbm_mib < 0:
        raise SystemExit(f"error: --hbm-mib {a.hbm_mib}: give a buffer size in MiB, or 0 for none")
    header = []
    if a.hbm_mib:
        gbs = allocating(lambda: measure_hbm(timer, device, a.hbm_mib, max(1, a.warmup), max(3, a.iters)),
                         f"--hbm-mib {a.hbm_mib}")
        note = (f"hbm_gbs = {gbs:.1f} (copy of {a.hbm_mib} MiB, read + write, median of "
                f"{max(3, a.iters)}; a hardware profile's hbm_gbs)")
        header.append(note)
        print(f"calibrate: memory bandwidth {gbs:.1f} GB/s: {note}", file=sys.stderr)
    rows, start = [], time.monotonic()
    incremental = not os.path.exists(a.output) or os.path.isfile(a.output)
    # Every dense series before any varlen one (the simulator prices dense rows), so a grid cut
    # short by --max-seconds keeps the rows fcp reads.
    series = [(False, None)] + [(True, n) for n in vdocs]
    grid = [(varlen, n, d, pas, mask) for varlen, n in series for d in dims for pas in passes for mask in masks]
    stopped = False
    for varlen, n, d, pas, mask in grid:
        if stopped:
            break
        seen = set()
        for L in lens:
            if a.max_seconds and time.monotonic() - start > a.max_seconds:
                print(f"calibrate: --max-seconds reached; {len(rows)} rows", file=sys.stderr)
                stopped = True
                break
            if varlen:
                if L // n < 1:
                    continue
                docs = [(L // n, L // n)] * n
                q_len = kv_len = (L // n) * n
                # n documents of L // n tokens: two lengths can round to one.
                if q_len in seen:
                    print(f"calibrate: --lens {L} with {n} documents rounds to {q_len}, "
                          f"already measured; skipped", file=sys.stderr)
                    continue
                seen.add(q_len)
            else:
                q_len, kv_len = L, max(1, round(L * a.kv_ratio))
                docs = [(q_len, kv_len)]
            secs, flops = allocating(lambda: measure(backend, timer, device, dtype, a.q_heads, a.kv_heads, d,
                                                     mask, pas, docs, a.warmup, a.iters),
                                     f"the {q_len}x{kv_len} tile ({len(rows)} rows written before it)")
            tflops = flops / secs / 1e12
            # fcp reads 1e-9..1e6 TFLOP/s (src/hardware/kernel.rs): a row outside would make
            # the whole file unreadable, so stop with the rows before it (bug hunt: a loaded
            # CPU wrote 1.7e-7 where the floor was 1e-6).
            if not 1e-9 <= tflops <= 1e6:
                raise SystemExit(f"error: {pas} {mask} hd{d} {q_len}x{kv_len} measured {tflops:.3g} TFLOP/s, "
                                 f"outside the 1e-9..1e6 fcp reads; the {len(rows)} rows before it are in "
                                 f"{a.output}")
            shape = f"{n} docs x {q_len // n}" if varlen else "batch 1"
            source = (f"scripts/calibrate.py on {dev_name}; {backend.name} {a.dtype}; {versions}; "
                      f"GQA {a.q_heads}:{a.kv_heads}; {shape}; median of {a.iters}; {today}")
            rows.append((pas, mask, d, "true" if varlen else "false", "total", q_len, kv_len,
                         f"{tflops:.6g}", source))
            print(f"{pas} {mask} hd{d} {'varlen ' + str(n) + ' docs' if varlen else 'dense'} "
                  f"{q_len}x{kv_len}: {secs * 1e3:.3f} ms, {tflops:.4g} TFLOP/s", file=sys.stderr)
            # The whole file again after every row (atomically): a run killed by a
            # timeout keeps a complete profile of the rows measured so far. Not into a pipe
            # or a device, which take one write (a second one waited forever on a named
            # pipe whose reader had gone).
            if incremental:
                save(a.output, dev_name, versions, today, rows, header)
    if not rows:
        raise SystemExit("error: no row measured")
    if not incremental:
        save(a.output, dev_name, versions, today, rows, header)
    print(f"calibrate: wrote {len(rows)} rows to {a.output}")


def allocating(work, what):
    """`work()`, with a clear error where the device cannot hold its tensors (bug hunt: a
    --kv-ratio of 1e30 or a --hbm-mib of 2⁴⁴ ended in a PyTorch traceback)."""
    try:
        return work()
    except (RuntimeError, MemoryError, OverflowError, ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(f"error: {what}: {first}") from None


def save(path, dev_name, versions, today, rows, header=()):
    """Write the profile CSV of `rows` to `path` (temporary file, then rename), `header`
    lines as comments after the first."""
    text = f"# Calibrated by scripts/calibrate.py on {dev_name} ({versions}), {today}\n"
    text += "".join(f"# {h}\n" for h in header)
    text += "pass,mask,head_dim,varlen,len_kind,q_len,kv_len,tflops,source\n"
    for r in rows:
        text += ",".join(str(x) for x in r[:-1]) + ',"' + r[-1].replace('"', "'") + '"\n'
    write_text(path, text)


if __name__ == "__main__":
    main()
