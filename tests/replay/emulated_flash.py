"""The varlen FlashAttention backend's glue, tested on the CPU against a stand-in for PyTorch's
ops (scripts/test-replay.sh runs it from the repository root).

`SdpaVarlenAttention` calls `torch.ops.aten._flash_attention_forward`/`_backward`, which only
run on CUDA. This file gives them CPU stand-ins that keep the ops' contract as PyTorch's
sources state it: rows of all pieces concatenated, int32 offsets, K/V heads dividing query
heads (GQA without expansion), causal masks aligned bottom-right within each piece, the
backward recomputing delta = rowsum(dO * O) from the O it is given, and the log-sum-exp laid
out [H, total_q] (PyTorch 2.7 on) or padded [pieces, H, max_q] (2.4-2.6). Under each layout it
runs the start-up self-test and a single-device replay of tests/replay/repeat-rows.json
(several pieces of one query row in a launch, heads splitting a GQA group) against dense
attention. What it cannot test is the kernel itself: the GPU session's preflight does that.
"""

import math
import sys

import torch

sys.path.insert(0, "scripts")
from fcp_exec import attention  # noqa: E402

import replay  # noqa: E402


def _probs(q, k, causal, scale, lse=None):
    """Scores [H, L, S] of one piece (K expanded to q's heads), or probabilities given lse [H, L]."""
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(g, 1)) * scale
    if causal:  # bottom-right: query i sees keys up to i + S - L
        L, S = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(L)[:, None] + (S - L), -math.inf)
    return s if lse is None else torch.exp(s - lse.unsqueeze(-1))


class FlashOps:
    """`_flash_attention_forward`/`_backward` on the CPU, with the lse `padded` or not."""

    def __init__(self, padded):
        self.padded = padded

    @staticmethod
    def _pieces(cq, ck):
        cq, ck = cq.tolist(), ck.tolist()
        assert len(cq) == len(ck)
        return [(cq[i], cq[i + 1], ck[i], ck[i + 1]) for i in range(len(cq) - 1)]

    def _forward(self, q, k, v, cq, ck, max_q, max_k, dropout, causal, debug, scale=None, **_):
        assert cq.dtype == ck.dtype == torch.int32 and q.shape[1] % k.shape[1] == 0
        ps = self._pieces(cq, ck)
        assert max_q == max(b - a for a, b, _, _ in ps) and max_k == max(e - c for _, _, c, e in ps)
        H, g = q.shape[1], q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        lse = torch.zeros(len(ps), H, max_q) if self.padded else torch.empty(H, q.shape[0])
        for i, (a, b, c, e) in enumerate(ps):
            s = _probs(q[a:b], k[c:e], causal, scale)
            ls = torch.logsumexp(s, -1)
            out[a:b] = torch.einsum("hqk,khd->qhd", torch.exp(s - ls.unsqueeze(-1)),
                                    v[c:e].float().repeat_interleave(g, 1)).to(q.dtype)
            if self.padded:
                lse[i, :, :b - a] = ls
            else:
                lse[:, a:b] = ls
        return out, lse, torch.empty(2, dtype=torch.uint64), torch.empty((), dtype=torch.uint64), torch.empty(0)

    def _backward(self, do, q, k, v, o, lse, cq, ck, max_q, max_k, dropout, causal, seed, offset, scale=None, **_):
        ps = self._pieces(cq, ck)
        H, Hk = q.shape[1], k.shape[1]
        g = H // Hk
        want = (len(ps), H, max_q) if self.padded else (H, q.shape[0])
        assert tuple(lse.shape) == want and lse.dtype == torch.float32, (tuple(lse.shape), want)
        delta = (do.float() * o.float()).sum(-1)  # the kernel's own, from the O it is given
        dq = torch.empty(q.shape, dtype=torch.float32)
        dk = torch.zeros(k.shape[0], H, k.shape[2])
        dv = torch.zeros_like(dk)
        for i, (a, b, c, e) in enumerate(ps):
            ls = lse[i, :, :b - a] if self.padded else lse[:, a:b]
            p = _probs(q[a:b], k[c:e], causal, scale, ls)
            dof = do[a:b].float()
            dv[c:e] += torch.einsum("hqk,qhd->khd", p, dof)
            dp = torch.einsum("qhd,khd->hqk", dof, v[c:e].float().repeat_interleave(g, 1))
            ds = p * (dp - delta[a:b].transpose(0, 1).unsqueeze(-1))
            dq[a:b] = torch.einsum("hqk,khd->qhd", ds, k[c:e].float().repeat_interleave(g, 1)) * scale
            dk[c:e] += torch.einsum("hqk,qhd->khd", ds, q[a:b].float()) * scale
        fold = lambda x: x.view(x.shape[0], Hk, g, -1).sum(2).to(q.dtype)
        return dq.to(q.dtype), fold(dk), fold(dv)


class _Torch:
    """`torch` as attention.py sees it, with the two ops replaced."""

    def __init__(self, ops):
        self.ops = type("Ops", (), {"aten": type("Aten", (), {
            "_flash_attention_forward": staticmethod(ops._forward),
            "_flash_attention_backward": staticmethod(ops._backward)})})

    def __getattr__(self, name):
        return getattr(torch, name)


def main():
    failures = 0
    for padded in (False, True):
        layout = "padded [pieces, H, max_q]" if padded else "[H, total_q]"
        attention.torch = _Torch(FlashOps(padded))
        backend = attention.SdpaVarlenAttention()
        problem = attention.self_test(backend, torch.device("cpu"), torch.float32, tol=1e-4)
        if problem is not None or backend._padded is not padded:
            print(f"FAIL self-test, lse {layout}: {problem or 'layout not recognised'}")
            failures += 1
            continue
        replay.choose_backend = lambda *_: backend
        rc = replay.main(["tests/replay/repeat-rows.json", "--single-device", "--head-dim", "8",
                          "--pass", "both", "--check", "yes", "--dtype", "float32", "-o", sys.argv[1] + f"/{padded}.json"])
        print(f"{'ok' if rc == 0 else 'FAIL'} replay of repeat-rows.json on the emulated varlen ops, lse {layout}")
        failures += rc != 0
    attention.torch = torch
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
