"""What one rank holds: Q, K, V, partial outputs, gradients and which rows are present."""

import math

import torch


class ExecError(Exception):
    """The plan cannot be executed as written (exit 1)."""


def fmt(r):
    return f"doc {r[0]} [{r[1]}, {r[2]})"


class Store:
    """Per tensor name, one flat tensor over the documents the rank touches (`docs`, all by
    default; `plan.rank_docs` for one rank), whole documents one after the other, allocated on
    first use of the name. `get(name, doc)` is the document's view; flat, so a step's pieces
    gather and merge as one indexed launch (fcp_exec.step)."""

    def __init__(self, plan, d, device, dtype, acc, docs=None):
        self.plan, self.d, self.device, self.dtype, self.acc = plan, d, device, dtype, acc
        self.offset, n = {}, 0
        for doc in range(len(plan.extent)) if docs is None else sorted(set(docs)):
            self.offset[doc] = n
            n += plan.extent[doc]
        self.rows = n
        self.layout = tuple(self.offset.items())  # what a row index depends on (step.launches)
        self.t = {}

    def flat(self, name):
        if name not in self.t:
            R, p = self.rows, self.plan
            H = p.kv_heads if name in ("k", "v", "kvhave", "dk", "dv") else p.q_heads
            if name in ("qhave", "kvhave", "bhave", "ohave"):
                x = torch.zeros(R, H, dtype=torch.bool, device=self.device)
            elif name in ("l", "lf"):
                x = torch.full((R, H), -math.inf, dtype=self.acc, device=self.device)
            elif name == "delta":
                x = torch.zeros(R, H, dtype=self.acc, device=self.device)
            elif name in ("q", "k", "v", "do"):
                x = torch.zeros(R, H, self.d, dtype=self.dtype, device=self.device)
            else:  # o, dq, dk, dv
                x = torch.zeros(R, H, self.d, dtype=self.acc, device=self.device)
            self.t[name] = x
        return self.t[name]

    def offset_of(self, doc):
        if doc not in self.offset:
            raise ExecError(f"doc {doc} is not among the documents this rank's plan touches")
        return self.offset[doc]

    def get(self, name, doc):
        off = self.offset_of(doc)
        return self.flat(name)[off:off + self.plan.extent[doc]]

    def docs(self, name):
        """The documents whose `name` rows exist on this rank (all of its documents once used)."""
        return sorted(self.offset) if name in self.t else []

    def require(self, have, r, heads, what, rank):
        h0, h1 = heads
        if not bool(self.get(have, r[0])[r[1]:r[2], h0:h1].all()):
            raise ExecError(f"rank {rank}: {what} of {fmt(r)} heads [{h0}, {h1}) is not on this rank")
