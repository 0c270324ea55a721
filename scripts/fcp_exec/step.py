"""A step's attention as the simulator prices it: one varlen launch per kind of piece.

docs/cost-model.md § Time of a step prices a rank's step as one launch over all its tiles. The
executor cuts every task into pieces (`attention.pieces`: full rectangles and causal squares on
the diagonal) and groups a step's pieces by what one launch must share: the mask (rectangle or
square), the query and K/V head ranges, and whether K/V heads are expanded for a task that
splits a GQA group. Each group gathers its rows from the rank's flat store into one
concatenated Q, K, V, runs one `forward_varlen`/`backward_varlen`, and scatters back in one
indexed merge (`merge_rows`, which also merges two pieces of one query row) or one indexed add
of gradients. A launch per piece would put Python's dispatch of every piece (zigzag's 8 × 32K
plan has about 900 a rank) into the measured compute, which the simulator does not price.
"""

import torch

from .attention import merge_rows, pieces
from .store import ExecError, fmt


def _task_views(plan, task):
    (qd, qs, qe), (kd, ks, ke), heads = task
    if qd != kd:
        raise ExecError(f"task {fmt(task[0])} × {fmt(task[1])} mixes two documents")
    h0, h1 = plan.q_heads_of(heads)
    k0, k1 = plan.kv_heads_of(heads)
    return qd, (h0, h1), (k0, k1)


def groups(plan, tasks):
    """A step's pieces by launch: {(causal, q heads, kv heads, expanded): [(doc, q0, q1, k0,
    k1)]}, groups and pieces in the order of the plan's tasks (deterministic)."""
    g = plan.group
    out = {}
    for task in tasks:
        doc, h, kh = _task_views(plan, task)
        expanded = not (h[0] % g == 0 and h[1] % g == 0)
        (_, qs, qe), (_, ks, ke), _ = task
        for (q0, q1, k0, k1, causal) in pieces(plan.mask, qs, qe, ks, ke):
            out.setdefault((causal, h, kh, expanded), []).append((doc, q0, q1, k0, k1))
    return out


class Launch:
    """The rows of one group in the flat store: `iq`/`ik` index the query and key rows of every
    piece, concatenated; `cu_q`/`cu_k` are the pieces' host offsets into them; `uq`/`invq` the
    distinct query rows and where each of `iq` falls among them (worked out on the host: on
    the device, `unique` would wait for the GPU in every launch)."""

    def __init__(self, store, ps, key):
        self.causal, self.h, self.kh, self.expanded = key
        self.ps = ps
        self.cu_q, iq = self._rows(store, [(d, a, b) for d, a, b, _, _ in ps])
        self.cu_k, ik = self._rows(store, [(d, c, e) for d, _, _, c, e in ps])
        uq, invq = torch.unique(iq, return_inverse=True)
        self.iq, self.ik, self.uq, self.invq = (x.to(store.device) for x in (iq, ik, uq, invq))
        self.hidx = None
        if self.expanded:  # each query head's K/V head, for a task that splits a GQA group
            g = store.plan.group
            self.hidx = torch.arange(self.h[0], self.h[1], device=store.device) // g

    @staticmethod
    def _rows(store, spans):
        cu, starts = [0], []
        for doc, s, e in spans:
            starts.append(store.offset_of(doc) + s - cu[-1])
            cu.append(cu[-1] + e - s)
        lens = torch.tensor([b - a for a, b in zip(cu, cu[1:])], dtype=torch.int64)
        return cu, torch.repeat_interleave(torch.tensor(starts, dtype=torch.int64), lens) + torch.arange(cu[-1])

    def queries(self, flat):
        """Rows of a per-query-head tensor ([T,H,...]) this launch reads, its heads only."""
        return flat[:, self.h[0]:self.h[1]].index_select(0, self.iq)

    def keys(self, flat):
        """K or V rows this launch reads: its K/V heads, or one per query head when expanded."""
        if self.expanded:
            return flat.index_select(0, self.ik).index_select(1, self.hidx)
        return flat[:, self.kh[0]:self.kh[1]].index_select(0, self.ik)

    def add_key_grad(self, flat, grad, acc):
        """Add gradients of the launch's K or V rows (per query head when expanded) into `flat`."""
        grad = grad.to(acc)
        if self.expanded:
            folded = torch.zeros(grad.shape[0], self.kh[1] - self.kh[0], grad.shape[2], dtype=acc, device=grad.device)
            grad = folded.index_add_(1, self.hidx - self.kh[0], grad)
        flat[:, self.kh[0]:self.kh[1]].index_add_(0, self.ik, grad)

    def require(self, store, rank, names):
        """Fail unless this rank holds every row the launch reads: one check for the launch,
        and piece by piece only to name the missing one."""
        checks = [(have, self.kh if what == "K/V" else self.h, idx, what)
                  for have, idx, what in (("qhave", self.iq, "Q"), ("kvhave", self.ik, "K/V"), ("bhave", self.iq, "dO"))
                  if have in names]
        for have, heads, idx, what in checks:
            if bool(store.flat(have)[:, heads[0]:heads[1]].index_select(0, idx).all()):
                continue
            for doc, q0, q1, k0, k1 in self.ps:
                r = (doc, q0, q1) if what != "K/V" else (doc, k0, k1)
                store.require(have, r, heads, what, rank)


_LAUNCHES = {}


def launches(plan, store, tasks):
    """The Launches of one step's tasks, made once per step and store layout: every warm-up and
    timed run repeats them, and making them (cutting tasks into pieces in Python, a host
    `unique`, copies to the device that synchronise the stream) would otherwise be timed as
    compute (review before the GPU session). Keyed by the task list itself (held in the cache,
    so its id cannot be reused) and everything the indices depend on."""
    k = (id(tasks), store.layout, str(store.device), plan.group, plan.mask)
    hit = _LAUNCHES.get(k)
    if hit is None or hit[0] is not tasks:
        if len(_LAUNCHES) >= 100_000:
            _LAUNCHES.clear()
        hit = _LAUNCHES[k] = (tasks, [Launch(store, ps, key) for key, ps in groups(plan, tasks).items()])
    return hit[1]


def forward(plan, store, backend, tasks, rank, scale, check_have=True):
    """The forward attention of one step's tasks, merged into the rank's partial outputs.
    With `check_have`, the tasks' query rows are marked as holding a partial output (`ohave`),
    which an `out` transfer must then send from."""
    if check_have:
        for task in tasks:
            doc, h, _ = _task_views(plan, task)
            store.get("ohave", doc)[task[0][1]:task[0][2], h[0]:h[1]] = True
    for ln in launches(plan, store, tasks):
        if check_have:
            ln.require(store, rank, ("qhave", "kvhave"))
        o, lse = backend.forward_varlen(ln.queries(store.flat("q")), ln.keys(store.flat("k")),
                                        ln.keys(store.flat("v")), ln.cu_q, ln.cu_k, ln.causal, scale)
        h = ln.h
        merge_rows(store.flat("o")[:, h[0]:h[1]], store.flat("l")[:, h[0]:h[1]], ln.uq, ln.invq, o, lse)


def backward(plan, store, backend, tasks, rank, scale, check_have=True):
    """The backward attention of one step's tasks, from the merged output's lse and delta,
    added into the rank's dQ, dK, dV."""
    for ln in launches(plan, store, tasks):
        if check_have:
            ln.require(store, rank, ("qhave", "kvhave", "bhave"))
        dq, dk, dv = backend.backward_varlen(
            ln.queries(store.flat("q")), ln.keys(store.flat("k")), ln.keys(store.flat("v")),
            ln.queries(store.flat("do")), ln.queries(store.flat("lf")), ln.queries(store.flat("delta")),
            ln.cu_q, ln.cu_k, ln.causal, scale)
        h = ln.h
        store.flat("dq")[:, h[0]:h[1]].index_add_(0, ln.iq, dq.to(store.acc))
        ln.add_key_grad(store.flat("dk"), dk, store.acc)
        ln.add_key_grad(store.flat("dv"), dv, store.acc)
