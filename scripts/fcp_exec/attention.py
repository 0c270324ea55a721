"""Attention kernels for the executor: forward with log-sum-exp, backward from the merged
output, on one tile piece at a time.

A plan's task is a (q range × kv range) tile of one document under the plan's mask. Kernels
differ in how they align a causal mask when the tile is not square (top-left or bottom-right),
so `pieces()` cuts every task into pieces that are either a full rectangle or a square on the
diagonal; both conventions agree on those, and any backend can run them. Partial results are
merged by log-sum-exp, exactly as a CP runtime merges the partials of different ranks.

Backends:
  * `torch`: plain PyTorch matmuls with an explicit mask. Runs anywhere (the CPU CI uses it in
    float64), and is the reference every faster backend is checked against at start-up.
  * `sdpa`: PyTorch's bundled FlashAttention through the ATen ops that return the log-sum-exp
    (`_scaled_dot_product_flash_attention` and its backward). CUDA only. GQA is handled by
    expanding K/V heads, which the calibration measures too, so the profile and the replay
    agree.
"""

import math

import torch


def pieces(mask, qs, qe, ks, ke):
    """Cut task q[qs,qe) × kv[ks,ke) into (q0, q1, k0, k1, causal_square) pieces covering
    exactly the pairs the mask allows. Causal means key position <= query position."""
    if mask == "full":
        return [(qs, qe, ks, ke, False)]
    ke = min(ke, qe)  # keys past the last query are never seen
    qs = max(qs, ks)  # queries before the first key see nothing
    if qs >= qe or ks >= ke:
        return []
    out = []
    b = min(qe, ke)  # rows [qs, b) cross the diagonal; rows from max(qs, b) see all of [ks, ke)
    if qs < b:
        if ks < qs:
            out.append((qs, b, ks, qs, False))
        out.append((qs, b, qs, b, True))
    if max(qs, b) < qe:
        out.append((max(qs, b), qe, ks, ke, False))
    return out


def merge_into(acc_o, acc_l, o, lse):
    """Merge a partial (o [L,H,d], lse [L,H]) into accumulators in place (float)."""
    m = torch.maximum(acc_l, lse)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a = torch.exp(acc_l - m_safe)
    b = torch.exp(lse - m_safe)
    s = a + b
    s_safe = torch.where(s == 0, torch.ones_like(s), s)
    acc_o.mul_((a / s_safe).unsqueeze(-1)).add_(o.to(acc_o.dtype) * (b / s_safe).unsqueeze(-1))
    acc_l.copy_(torch.where(s == 0, acc_l, m_safe + torch.log(s_safe)))


def _expand(kv, group):
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


class TorchAttention:
    """Reference kernels: explicit scores, mask and softmax, over chunks of query rows so the
    score matrix stays within `budget` elements (a 32K × 32K tile on 64 heads would not fit)."""

    name = "torch"
    budget = 1 << 27

    def _chunks(self, L, H, S):
        step = max(1, self.budget // max(1, H * S))
        return [(i, min(L, i + step)) for i in range(0, L, step)]

    @staticmethod
    def _scores(qf, kf, scale, causal, i0, i1):
        s = torch.einsum("qhd,khd->hqk", qf[i0:i1], kf) * scale
        if causal:
            rows = torch.arange(i0, i1, device=qf.device).unsqueeze(1)
            cols = torch.arange(kf.shape[0], device=qf.device).unsqueeze(0)
            s = s.masked_fill(cols > rows, -math.inf)
        return s

    def forward(self, q, k, v, causal, scale):
        """q [L,H,d], k/v [S,Hk,d] -> (o [L,H,d] float, lse [L,H] float32/64)."""
        g = q.shape[1] // k.shape[1]
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        qf, kf, vf = q.to(acc), _expand(k, g).to(acc), _expand(v, g).to(acc)
        L, H, _ = q.shape
        os_, ls = [], []
        for i0, i1 in self._chunks(L, H, k.shape[0]):
            s = self._scores(qf, kf, scale, causal, i0, i1)
            lse = torch.logsumexp(s, dim=-1)  # [H, l]
            os_.append(torch.einsum("hqk,khd->qhd", torch.exp(s - lse.unsqueeze(-1)), vf))
            ls.append(lse.transpose(0, 1))
        return torch.cat(os_), torch.cat(ls).contiguous()

    def backward(self, q, k, v, do, lse, delta, causal, scale):
        """Gradients of one piece given the *merged* output's lse [L,H] and
        delta = rowsum(dO * O) [L,H]. Returns (dq [L,H,d], dk, dv [S,Hk,d]) in float."""
        g = q.shape[1] // k.shape[1]
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        qf, kf, vf = q.to(acc), _expand(k, g).to(acc), _expand(v, g).to(acc)
        dof, lsef, deltaf = do.to(acc), lse.to(acc), delta.to(acc)
        L, H, _ = q.shape
        dk, dv, dqs = torch.zeros_like(kf), torch.zeros_like(vf), []
        for i0, i1 in self._chunks(L, H, k.shape[0]):
            s = self._scores(qf, kf, scale, causal, i0, i1)
            p = torch.exp(s - lsef[i0:i1].transpose(0, 1).unsqueeze(-1))
            dv += torch.einsum("hqk,qhd->khd", p, dof[i0:i1])
            dp = torch.einsum("qhd,khd->hqk", dof[i0:i1], vf)
            ds = p * (dp - deltaf[i0:i1].transpose(0, 1).unsqueeze(-1))
            dqs.append(torch.einsum("hqk,khd->qhd", ds, kf) * scale)
            dk += torch.einsum("hqk,qhd->khd", ds, qf[i0:i1]) * scale
        if g > 1:
            S, Hx, d = dk.shape
            dk = dk.view(S, Hx // g, g, d).sum(2)
            dv = dv.view(S, Hx // g, g, d).sum(2)
        return torch.cat(dqs), dk, dv


class SdpaAttention:
    """PyTorch's bundled FlashAttention (CUDA), through the ATen ops that expose the lse."""

    name = "sdpa"

    def forward(self, q, k, v, causal, scale):
        g = q.shape[1] // k.shape[1]
        qb = q.transpose(0, 1).unsqueeze(0)
        kb = _expand(k, g).transpose(0, 1).unsqueeze(0)
        vb = _expand(v, g).transpose(0, 1).unsqueeze(0)
        res = torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, causal, False, scale=scale)
        o, lse = res[0], res[1]
        return o[0].transpose(0, 1), lse[0].transpose(0, 1).float()

    def backward(self, q, k, v, do, lse, delta, causal, scale):
        g = q.shape[1] // k.shape[1]
        # The kernel recomputes delta from (dO, O); any O with rowsum(dO*O) == delta works, so
        # pass O = dO * delta / |dO|^2 built in float32 (merged O lives on another rank).
        qb = q.transpose(0, 1).unsqueeze(0)
        kb = _expand(k, g).transpose(0, 1).unsqueeze(0).contiguous()
        vb = _expand(v, g).transpose(0, 1).unsqueeze(0).contiguous()
        dof = do.float()
        nrm = (dof * dof).sum(-1).clamp_min(1e-30)
        o_eq = (dof * (delta.float() / nrm).unsqueeze(-1)).to(q.dtype)
        dob = do.transpose(0, 1).unsqueeze(0)
        ob = o_eq.transpose(0, 1).unsqueeze(0)
        lseb = lse.float().transpose(0, 1).unsqueeze(0).contiguous()
        L, S = q.shape[0], k.shape[0]
        # cum_seq_q/k undefined (None), as the forward returns them for a dense batch: any
        # defined tensor, even an empty one, selects the varlen kernel, which refuses int64
        # offsets, and the self-test then fell back to the plain backend (review before the
        # first GPU session).
        seed = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dob, qb, kb, vb, ob, lseb, None, None, L, S, 0.0, causal, seed, seed, scale=scale
        )
        dq = dq[0].transpose(0, 1).float()
        dk = dk[0].transpose(0, 1).float()
        dv = dv[0].transpose(0, 1).float()
        if g > 1:
            S_, H, d = dk.shape
            dk = dk.view(S_, H // g, g, d).sum(2)
            dv = dv.view(S_, H // g, g, d).sum(2)
        return dq, dk, dv


def self_test(backend, device, dtype, tol=3e-2):
    """Check `backend` against the reference on a small GQA problem (both piece kinds, fwd and
    bwd). Returns None when it agrees, else a message saying what differed."""
    ref = TorchAttention()
    gen = torch.Generator(device="cpu").manual_seed(7)
    L, H, Hk, d = 96, 4, 2, 64
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    q, k, v, do = mk(L, H, d), mk(L, Hk, d), mk(L, Hk, d), mk(L, H, d)
    scale = 1.0 / math.sqrt(d)
    try:
        for causal in (False, True):
            o1, l1 = backend.forward(q, k, v, causal, scale)
            o0, l0 = ref.forward(q, k, v, causal, scale)
            delta = (do.float() * o0.float()).sum(-1)
            g1 = backend.backward(q, k, v, do, l0, delta, causal, scale)
            g0 = ref.backward(q, k, v, do, l0, delta, causal, scale)
            pairs = [("out", o1, o0), ("lse", l1, l0)] + list(zip(("dq", "dk", "dv"), g1, g0))
            for name, a, b in pairs:
                err = (a.float() - b.float()).abs().max().item()
                if not err <= tol * max(1.0, b.float().abs().max().item()):
                    return f"{backend.name} {name} (causal={causal}) differs from the reference by {err:.3g}"
    except Exception as e:  # an op missing or with another signature in this PyTorch
        return f"{backend.name} failed: {type(e).__name__}: {e}"
    return None


def choose_backend(name, device, dtype, log):
    """The backend to use: `torch`, `sdpa`, or `auto` (sdpa on CUDA when its self-test
    passes, else torch)."""
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention()
    if device.type != "cuda":
        raise SystemExit(f"error: backend {name} needs a CUDA device")
    cand = SdpaAttention()
    problem = self_test(cand, device, dtype)
    if problem is None:
        return cand
    if name == "sdpa":
        raise SystemExit(f"error: {problem}")
    log(f"warning: {problem}; falling back to the plain PyTorch backend")
    return TorchAttention()
