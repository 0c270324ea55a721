"""Running a plan: the step loop with its messages and collectives, the backward pass derived
from the forward plan, and timing (a rank's tensors live in store.py, a step's attention in
step.py).

Data movement follows the plan and nothing else: a rank starts with the Q/K/V of its input
layout (its `owned` ranges when the plan has none) and every other row it reads must arrive by
a transfer first — reading a row that is not there is an error, so a plan that drops a transfer
fails loudly. Partial outputs travel with their log-sum-exp and are merged on arrival; sending
an `out` row hands it over (the sender forgets it), so a row merged twice cannot go unnoticed.

The backward pass is derived the way the simulator derives it (src/sim/program.rs): `out`
transfers become the reverse delivery of dO (with the merged output's lse and
delta = rowsum(dO·O)) before step 0; every Q and K/V transfer runs again with the same timing;
each step runs the backward of its tasks; and the gradient of every Q/K/V transfer goes back
along the reverse edge, deepest forwarding first, after the last step.
"""

import math
import threading
import time

import torch

from . import step
from .attention import merge_into
from .plan import call_joins, depths, forwarded


class Data:
    """The batch's global Q, K, V and dO. `full`: every document generated whole from the seed
    (identical on every rank, so each rank can check its rows against dense attention);
    otherwise random rows of the right shapes, made where they are needed (large plans)."""

    def __init__(self, plan, d, seed, device, dtype, full):
        self.plan, self.d, self.seed, self.device, self.dtype, self.full = plan, d, seed, device, dtype, full
        self.cache = {}

    def doc(self, doc):
        if doc not in self.cache:
            p, E = self.plan, self.plan.extent[doc]
            g = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + doc)
            mk = lambda h: torch.randn(E, h, self.d, generator=g, dtype=torch.float64)
            q, k, v, do = mk(p.q_heads), mk(p.kv_heads), mk(p.kv_heads), mk(p.q_heads)
            self.cache[doc] = tuple(x.to(device=self.device, dtype=self.dtype) for x in (q, k, v, do))
        return self.cache[doc]

    def rows(self, which, doc, s, e):
        """Rows s..e of tensor `which` (0 q, 1 k, 2 v, 3 dO) of document `doc`."""
        if self.full:
            return self.doc(doc)[which][s:e]
        h = self.plan.q_heads if which in (0, 3) else self.plan.kv_heads
        return torch.randn(e - s, h, self.d, device=self.device, dtype=self.dtype)


def load_initial(store, data, ranges, with_grad_inputs=False):
    for (doc, s, e) in ranges:
        store.get("q", doc)[s:e] = data.rows(0, doc, s, e)
        store.get("k", doc)[s:e] = data.rows(1, doc, s, e)
        store.get("v", doc)[s:e] = data.rows(2, doc, s, e)
        store.get("qhave", doc)[s:e] = True
        store.get("kvhave", doc)[s:e] = True


# ---------------------------------------------------------------- messages

class Msg:
    """One transfer of one phase: the plan's transfer, the payload it carries, the direction."""

    __slots__ = ("t", "payload", "src", "dst", "issue", "due", "tag", "reverse")

    def __init__(self, t, payload, reverse, tag, nsteps):
        self.t, self.payload, self.reverse, self.tag = t, payload, reverse, tag
        self.src, self.dst = (t.dst, t.src) if reverse else (t.src, t.dst)
        self.issue = min(t.issue_at, nsteps)
        self.due = min(t.arrive_by, nsteps)


def heads_for(plan, payload, heads):
    if payload in ("kv", "dkv"):
        return plan.kv_heads_of(heads)
    return plan.q_heads_of(heads)


def msg_numel(plan, m, d):
    h0, h1 = heads_for(plan, m.payload, m.t.heads)
    rows = sum(e - s for (_, s, e) in m.t.ranges) * (h1 - h0)
    per = {"q": d, "kv": 2 * d, "out": d + 1, "dout": d + 2, "dq": d, "dkv": 2 * d}[m.payload]
    return rows * per


def msg_dtype(store, payload):
    return store.dtype if payload in ("q", "kv") else store.acc


# What a rank must hold to send each payload, and its name in the error. An `out` row it computed
# no partial of went out as zeros and merged as nothing (bug hunt: an extra `out` transfer
# replayed as PASS; `fcp verify` refuses it). Gradients are sent whatever was accumulated.
SENDER_HOLDS = {"q": ("qhave", "Q"), "kv": ("kvhave", "K/V"), "out": ("ohave", "the partial output"),
                "dout": ("bhave", "dO")}


def pack(store, m, rank, check=True):
    """Flatten what `m` sends from `store`; outputs and gradients are handed over (cleared).
    `check`: first fail unless the rank holds every row it sends (SENDER_HOLDS)."""
    p, parts = store.plan, []
    h0, h1 = heads_for(p, m.payload, m.t.heads)
    holds = SENDER_HOLDS.get(m.payload) if check else None
    for r in m.t.ranges:
        doc, s, e = r
        if holds:
            store.require(holds[0], r, (h0, h1), holds[1], rank)
        if m.payload == "q":
            parts.append(store.get("q", doc)[s:e, h0:h1])
        elif m.payload == "kv":
            parts += [store.get("k", doc)[s:e, h0:h1], store.get("v", doc)[s:e, h0:h1]]
        elif m.payload == "out":
            store.get("ohave", doc)[s:e, h0:h1] = False
            o, l = store.get("o", doc)[s:e, h0:h1], store.get("l", doc)[s:e, h0:h1]
            parts += [o.clone(), l.clone()]
            o.zero_()
            l.fill_(-math.inf)
        elif m.payload == "dout":
            parts += [store.get("do", doc)[s:e, h0:h1].to(store.acc), store.get("lf", doc)[s:e, h0:h1],
                      store.get("delta", doc)[s:e, h0:h1]]
        elif m.payload == "dq":
            g = store.get("dq", doc)[s:e, h0:h1]
            parts.append(g.clone())
            g.zero_()
        else:  # dkv
            gk, gv = store.get("dk", doc)[s:e, h0:h1], store.get("dv", doc)[s:e, h0:h1]
            parts += [gk.clone(), gv.clone()]
            gk.zero_()
            gv.zero_()
    dt = msg_dtype(store, m.payload)
    if not parts:
        return torch.empty(0, dtype=dt, device=store.device)
    return torch.cat([x.reshape(-1).to(dt) for x in parts])


def unpack(store, m, flat):
    p, d, off = store.plan, store.d, 0
    h0, h1 = heads_for(p, m.payload, m.t.heads)
    H = h1 - h0

    def take(n_rows, width):
        nonlocal off
        n = n_rows * H * width
        x = flat[off:off + n]
        off += n
        return x.view(n_rows, H, width) if width > 1 else x.view(n_rows, H)

    for (doc, s, e) in m.t.ranges:
        n = e - s
        if m.payload == "q":
            store.get("q", doc)[s:e, h0:h1] = take(n, d)
            store.get("qhave", doc)[s:e, h0:h1] = True
        elif m.payload == "kv":
            store.get("k", doc)[s:e, h0:h1] = take(n, d)
            store.get("v", doc)[s:e, h0:h1] = take(n, d)
            store.get("kvhave", doc)[s:e, h0:h1] = True
        elif m.payload == "out":
            o, l = take(n, d), take(n, 1)
            merge_into(store.get("o", doc)[s:e, h0:h1], store.get("l", doc)[s:e, h0:h1], o, l)
            store.get("ohave", doc)[s:e, h0:h1] = True  # now held here, and may go on
        elif m.payload == "dout":
            store.get("do", doc)[s:e, h0:h1] = take(n, d).to(store.dtype)
            store.get("lf", doc)[s:e, h0:h1] = take(n, 1)
            store.get("delta", doc)[s:e, h0:h1] = take(n, 1)
            store.get("bhave", doc)[s:e, h0:h1] = True
        elif m.payload == "dq":
            store.get("dq", doc)[s:e, h0:h1] += take(n, d)
        else:
            store.get("dk", doc)[s:e, h0:h1] += take(n, d)
            store.get("dv", doc)[s:e, h0:h1] += take(n, d)


def prepare_backward(plan, store, data, final_ranges):
    """Seed dO, the merged lse and delta on the rows whose final output this rank holds."""
    for (doc, s, e) in final_ranges:
        o = store.get("o", doc)[s:e]
        do = data.rows(3, doc, s, e)
        store.get("do", doc)[s:e] = do
        store.get("lf", doc)[s:e] = store.get("l", doc)[s:e]
        store.get("delta", doc)[s:e] = (do.to(store.acc) * o).sum(-1)
        store.get("bhave", doc)[s:e] = True


# ---------------------------------------------------------------- clock

class Clock:
    """Wall time in ms that waits for the device first, so a span covers the kernels it
    launched (a step is timed from its first launch to its last kernel's end)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def now(self):
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() * 1e3


class PassTiming:
    def __init__(self, name, nsteps):
        self.name = name
        self.compute = [0.0] * nsteps
        self.wait = [0.0] * nsteps
        self.spans = []  # (start, end) of this rank's messages and collectives, ms
        self.start = 0.0
        self.end = 0.0

    def as_json(self, with_comm):
        comm = union_len(self.spans)
        return {
            "pass": self.name,
            "compute_ms": sum(self.compute),
            "comm_ms": comm if with_comm else None,
            "exposed_comm_ms": (sum(self.wait) + max(0.0, self.end - self.start - sum(self.compute) - sum(self.wait)))
            if with_comm else None,
            "end_ms": self.end - self.start if with_comm else None,
            "steps": [{"step": i, "compute_ms": c, "wait_ms": w if with_comm else None}
                      for i, (c, w) in enumerate(zip(self.compute, self.wait))],
        }


def union_len(spans):
    total, cur = 0.0, None
    for a, b in sorted(spans):
        if cur and a <= cur[1]:
            cur = (cur[0], max(cur[1], b))
        else:
            if cur:
                total += cur[1] - cur[0]
            cur = (a, b)
    if cur:
        total += cur[1] - cur[0]
    return total


# ---------------------------------------------------------------- distributed phases

class Watch:
    """A torch.distributed work waited for on a thread of its own, so that the replay can poll
    it: gloo's point-to-point receives say they are complete only once waited for. Stands in
    for the work: `wait` returns (or raises) as the work's did."""

    def __init__(self, work):
        self.work, self.error = work, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.work.wait()
        except Exception as e:  # handed to the main thread by `wait`
            self.error = e

    @staticmethod
    def over(table, key):
        """The watch over the work of `table[key]` (a tuple led by the work), started once."""
        work, *rest = table[key]
        if not isinstance(work, Watch):
            work = Watch(work)
            table[key] = (work, *rest)
        return work

    def done(self):
        return not self.thread.is_alive()

    def wait(self):
        self.thread.join()
        if self.error is not None:
            raise self.error


class Exchange:
    """The messages of one phase on one rank over torch.distributed: receives are posted up
    front, sends leave at their issue step (forwarded data once it has arrived), receives are
    unpacked before the step they are due by; a collective call whose pieces span the whole
    group runs as one all_to_all_single (pieces as its splits) when every rank meets the calls
    in the same order, else its pieces go point to point."""

    def __init__(self, ctx, msgs, deps, collectives, check=True):
        self.ctx, self.msgs, self.deps, self.check = ctx, msgs, deps, check
        rank, n = ctx.rank, ctx.world
        self.by_index = {m.t.index: m for m in msgs}
        every = {}
        for m in msgs:
            if m.t.call_key() is not None:
                every.setdefault(m.t.call_key(), []).append(m)
        # The step each member joins each call at (plan.py `call_joins`).
        join = call_joins((m.t.call_key(), m.src, m.dst, m.issue) for m in msgs)
        calls = every if collectives else {}
        # A call one of whose pieces forwards data its rank received goes point to point: the
        # order in which every rank must meet whole-group calls then depends on data, and a
        # fixed one hung (bug hunt: a call forwarding what another call of the same step
        # brings, joined first; a call forwarding outputs a rank sends only once a later call
        # has run).
        whole = {k: ms for k, ms in calls.items()
                 if len({x for m in ms for x in (m.src, m.dst)}) == n
                 and len({m.payload in ("q", "kv") for m in ms}) == 1
                 and not any(deps.get(m.t.index) for m in ms)}
        # Every rank must meet the whole-group calls in the same order.
        orders = [[k for _, k in sorted((join[(k, r)], k) for k in whole)] for r in range(n)]
        if any(o != orders[0] for o in orders):
            whole = {}
        self.calls = whole
        in_call = {m.t.index for ms in whole.values() for m in ms}
        # A piece of a call sent point to point (`--collectives p2p` too) leaves when its
        # source joins the call, the earliest piece it sends or receives, as in a whole-group
        # call (bug hunt: an output piece left at its own later step and took outputs
        # computed after the join along).
        for key, ms in every.items():
            if key not in whole:
                for m in ms:
                    m.issue = join[(key, m.src)]
        self.p2p_send = [m for m in msgs if m.src == rank and m.t.index not in in_call]
        self.p2p_recv = [m for m in msgs if m.dst == rank and m.t.index not in in_call]
        self.my_calls = [(join[(k, rank)], k) for k in whole]
        self.my_calls.sort()
        self.pending = {}  # index -> (work, buf, msg, issued_ms) for receives
        self.call_pending = {}
        self.joined = set()
        self.step_start = {}
        self.call_of = {m.t.index: k for k, ms in whole.items() for m in ms}
        self.sends = []
        self.done = set()

    def post_receives(self, store):
        import torch.distributed as dist
        for m in sorted(self.p2p_recv, key=lambda m: m.t.index):
            buf = torch.empty(msg_numel(store.plan, m, store.d), dtype=msg_dtype(store, m.payload), device=store.device)
            self.pending[m.t.index] = (dist.irecv(buf, src=m.src, tag=m.tag), buf, m)

    def _wait_recv(self, store, index, timing, clock):
        if index in self.done:
            return
        if index in self.pending:
            work, buf, m = self.pending.pop(index)
            # From the start of this rank's step at which the message was issued: the time
            # it could have been in flight (before, from when the wait began, which hid a
            # message that had arrived during compute).
            t0 = self.step_start.get(m.issue, clock.now())
            work.wait()
            t1 = clock.now()
            timing.spans.append((t0, t1))
            unpack(store, m, buf)
            self.done.add(index)
        else:
            key = self.call_of.get(index)
            if key is None:
                return
            # A piece of a call this rank has not joined yet: a send forwarding what the
            # call brings, at the call's own step (sends go first). Join every call up to it
            # in the order all ranks meet them, then wait. Before, the wait did nothing and
            # the send found its rows missing (bug hunt).
            if key not in self.joined:
                for _, k in self.my_calls:
                    if k not in self.joined:
                        self._join(store, k, timing, clock)
                    if k == key:
                        break
            if key in self.call_pending:
                self._finish_call(store, key, timing, clock)

    def _finish_call(self, store, key, timing, clock):
        work, outbuf, recv_list, t0 = self.call_pending.pop(key)
        work.wait()
        t1 = clock.now()
        timing.spans.append((t0, t1))
        off = 0
        for m in recv_list:
            n = msg_numel(store.plan, m, store.d)
            unpack(store, m, outbuf[off:off + n])
            off += n
            self.done.add(m.t.index)
        for m in self.calls[key]:
            self.done.add(m.t.index)

    def _wait_deps(self, store, m, timing, clock):
        for i in self.deps.get(m.t.index, []):
            if i in self.by_index and self.by_index[i].dst == self.ctx.rank:
                self._wait_recv(store, i, timing, clock)

    def _waits(self, m):
        """Whether sending `m` must wait for data not yet here."""
        return bool(self._missing(m))

    def issue(self, store, step, timing, clock):
        """Sends and collective joins at `step`, none blocking: each leaves once the data it
        forwards is here, calls are joined in the order every rank meets them, and while some
        wait, what they wait for is polled. A send or join that waits must not hold up one
        that is ready, nor another that waits: which comes first depends on other ranks (bug
        hunts: a rank waiting to forward a message before joining the step's collective, or
        waiting on a forward whose data came through a call it had yet to join, hung plans
        `fcp verify` and `fcp simulate` run; a rank joining a ready call before a waiting one
        met the calls in another order than its peers, and gloo aborted)."""
        rank = self.ctx.rank
        self.step_start.setdefault(step, clock.now())
        self.poll_sends(timing, clock)
        sends = sorted((m for m in self.p2p_send if m.issue == step), key=lambda m: m.t.index)
        joins = [key for join, key in self.my_calls if join == step and key not in self.joined]
        stuck_since = time.monotonic()
        while sends or joins:
            moved = False
            for m in [m for m in sends if not self._waits(m)]:
                self._send(store, m, timing, clock)
                sends.remove(m)
                moved = True
            while joins and (joins[0] in self.joined
                             or not any(self._waits(m) for m in self.calls[joins[0]] if m.src == rank)):
                key = joins.pop(0)
                if key not in self.joined:
                    self._join(store, key, timing, clock)
                moved = True
            if not (sends or joins):
                break
            waiting = sends + [m for m in self.calls[joins[0]] if m.src == rank] if joins else sends
            if moved or self._poll(store, waiting, timing, clock):
                stuck_since = time.monotonic()
            elif time.monotonic() - stuck_since > self.ctx.timeout:
                raise RuntimeError(f"rank {rank}, step {step}: waited {self.ctx.timeout} s for the data of "
                                   f"transfers {sorted({i for m in waiting for i in self._missing(m)})}")
            else:
                time.sleep(0.0002)

    def _missing(self, m):
        """Transfers into this rank that sending `m` waits for."""
        rank = self.ctx.rank
        return [i for i in self.deps.get(m.t.index, [])
                if i in self.by_index and self.by_index[i].dst == rank and i not in self.done]

    def _poll(self, store, waiting, timing, clock):
        """Take in, without blocking, what the messages in `waiting` wait for and has come:
        point-to-point receives and calls joined that have completed. Whether anything did."""
        moved = False
        for i in sorted({i for m in waiting for i in self._missing(m)}):
            if i in self.pending:
                if Watch.over(self.pending, i).done():
                    self._wait_recv(store, i, timing, clock)
                    moved = True
            else:
                key = self.call_of.get(i)
                if key in self.call_pending and Watch.over(self.call_pending, key).done():
                    self._finish_call(store, key, timing, clock)
                    moved = True
        return moved

    def _send(self, store, m, timing, clock):
        """Send point-to-point message `m` once the data it forwards is here."""
        import torch.distributed as dist
        self._wait_deps(store, m, timing, clock)
        buf = pack(store, m, self.ctx.rank, self.check)
        t0 = clock.now()
        self.sends.append((dist.isend(buf, dst=m.dst, tag=m.tag), buf, t0))

    def _join(self, store, key, timing, clock):
        """Join collective call `key`: pack this rank's pieces and start the exchange."""
        import torch.distributed as dist
        rank = self.ctx.rank
        self.joined.add(key)
        ms = sorted(self.calls[key], key=lambda m: m.t.index)
        for m in ms:
            if m.src == rank:
                self._wait_deps(store, m, timing, clock)
        ins, outs, parts, recv_list = [], [], [], []
        for peer in range(self.ctx.world):
            out_peer = [m for m in ms if m.src == rank and m.dst == peer]
            in_peer = [m for m in ms if m.dst == rank and m.src == peer]
            bufs = [pack(store, m, rank, self.check) for m in out_peer]
            parts += bufs
            ins.append(sum(b.numel() for b in bufs))
            outs.append(sum(msg_numel(store.plan, m, store.d) for m in in_peer))
            recv_list += in_peer
        dt = msg_dtype(store, ms[0].payload)
        inbuf = torch.cat(parts) if parts else torch.empty(0, dtype=dt, device=store.device)
        outbuf = torch.empty(sum(outs), dtype=dt, device=store.device)
        t0 = clock.now()
        work = dist.all_to_all_single(outbuf, inbuf, output_split_sizes=outs, input_split_sizes=ins, async_op=True)
        self.call_pending[key] = (work, outbuf, recv_list, t0)

    def poll_sends(self, timing, clock):
        """Close the spans of sends seen complete, at a step boundary (a send's span ran to
        the end of the pass before, so every rank's comm_ms was about its end_ms)."""
        left = []
        for work, buf, t0 in self.sends:
            if work.is_completed():
                timing.spans.append((t0, clock.now()))
            else:
                left.append((work, buf, t0))
        self.sends = left

    def arrivals(self, store, step, timing, clock):
        """Unpack the inputs due by `step`. Partial outputs are not inputs: no step waits for
        them (they merge at the end, or before their rank passes them on), as `fcp verify`
        and the simulator read a plan (bug hunt: waiting for an output due early, in a call
        another rank joins only after its last step, hung a plan both had run)."""
        self.poll_sends(timing, clock)
        for m in sorted(self.msgs, key=lambda m: m.t.index):
            if m.dst == self.ctx.rank and m.due <= step and m.payload != "out" and m.t.index not in self.done:
                self._wait_recv(store, m.t.index, timing, clock)
        for key in list(self.call_pending):
            if any(m.dst == self.ctx.rank and m.due <= step and m.payload != "out" for m in self.calls[key]):
                self._finish_call(store, key, timing, clock)

    def finish(self, store, timing, clock):
        for m in sorted(self.msgs, key=lambda m: m.t.index):
            if m.dst == self.ctx.rank and m.t.index not in self.done:
                self._wait_recv(store, m.t.index, timing, clock)
        for key in list(self.call_pending):
            self._finish_call(store, key, timing, clock)
        for work, _, t0 in self.sends:
            work.wait()
            timing.spans.append((t0, clock.now()))
        self.sends = []


class Ctx:
    """This process's rank, the world size, and how long (seconds) a send may wait for its data
    before the replay gives up (as the collectives' timeout)."""

    def __init__(self, rank, world, timeout=300):
        self.rank, self.world, self.timeout = rank, world, timeout


PHASE_TAG = {"fwd": 0, "bwd": 1, "dout": 2, "grad": 3}


def _msgs(plan, tensors, payload_of, reverse, phase):
    return [Msg(t, payload_of(t), reverse, t.index * 4 + PHASE_TAG[phase], plan.nsteps)
            for t in plan.transfers if t.tensor in tensors]


def run_steps(plan, ctx, store, backend, msgs, deps, collectives, compute, timing, clock, scale, check_have):
    ex = Exchange(ctx, msgs, deps, collectives, check_have)
    ex.post_receives(store)
    S = plan.nsteps
    tasks = plan.steps[ctx.rank]
    for s in range(S + 1):
        # The step's wait is the whole gap since the previous step: its sends (which may
        # block until the data they forward is here) and its arrivals, as the simulator's
        # gap between steps (bug hunt: a ring rank blocked 28 ms in its sends read 0.02 ms).
        t0 = clock.now()
        ex.issue(store, s, timing, clock)
        if s == S:
            break
        ex.arrivals(store, s, timing, clock)
        t1 = clock.now()
        compute(plan, store, backend, tasks[s] if s < len(tasks) else (), ctx.rank, scale, check_have)
        t2 = clock.now()
        timing.wait[s] += t1 - t0
        timing.compute[s] += t2 - t1
    ex.finish(store, timing, clock)


def run_reverse(plan, ctx, store, msgs, depth, timing, clock, check_have):
    """Reverse-edge phase (dO delivery or gradient return): deepest forwarding first, each
    level as one exchange that every rank completes before the next."""
    levels = sorted({depth[m.t.index] for m in msgs}, reverse=True)
    for lv in levels:
        ms = [m for m in msgs if depth[m.t.index] == lv]
        ex = Exchange(ctx, ms, {}, False, check_have)
        ex.post_receives(store)
        for m in ms:
            m.issue = 0
        ex.issue(store, 0, timing, clock)
        ex.finish(store, timing, clock)


def distributed_pass(plan, ctx, store, backend, data, which, collectives, clock, scale, timing, check_have=True):
    """Run `which` ('fwd' or 'bwd') on this rank; fills `timing`. `check_have`: every launch
    first checks that its rows are on this rank (a device-to-host sync per launch: the replay
    checks the first run, as every run moves the same rows)."""
    import torch.distributed as dist
    dist.barrier()
    timing.start = clock.now()
    if which == "fwd":
        msgs = _msgs(plan, ("q", "kv", "out"), lambda t: t.tensor, False, "fwd")
        run_steps(plan, ctx, store, backend, msgs, forwarded(plan), collectives, step.forward, timing, clock, scale,
                  check_have)
    else:
        dmsgs = _msgs(plan, ("out",), lambda t: "dout", True, "dout")
        t0 = clock.now()
        run_reverse(plan, ctx, store, dmsgs, depths(plan, ("out",)), timing, clock, check_have)
        if plan.nsteps:
            timing.wait[0] += clock.now() - t0  # dO must be in place before step 0
        msgs = _msgs(plan, ("q", "kv"), lambda t: t.tensor, False, "bwd")
        deps = {i: ds for i, ds in forwarded(plan).items() if plan.transfers[i].tensor != "out"}
        run_steps(plan, ctx, store, backend, msgs, deps, collectives, step.backward, timing, clock, scale,
                  check_have)
        gmsgs = _msgs(plan, ("q", "kv"), lambda t: "dq" if t.tensor == "q" else "dkv", True, "grad")
        run_reverse(plan, ctx, store, gmsgs, depths(plan, ("q", "kv")), timing, clock, check_have)
    timing.end = clock.now()
