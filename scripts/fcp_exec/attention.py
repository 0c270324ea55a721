"""Attention kernels for the executor: forward with log-sum-exp, backward from the merged
output, one varlen launch over many tile pieces (a step's pieces, as the simulator prices a
step: docs/cost-model.md § Time of a step).

A plan's task is a (q range × kv range) tile of one document under the plan's mask. Kernels
differ in how they align a causal mask when the tile is not square (top-left or bottom-right),
so `pieces()` cuts every task into pieces that are either a full rectangle or a square on the
diagonal; both conventions agree on those, and any backend can run them. Partial results are
merged by log-sum-exp, exactly as a CP runtime merges the partials of different ranks.

Every backend answers `forward_varlen`/`backward_varlen`: pieces concatenated along the rows,
cut by host offset lists `cu_q`/`cu_k` (piece i is q rows cu_q[i]..cu_q[i+1] against kv rows
cu_k[i]..cu_k[i+1]); `forward`/`backward` are the one-piece case.

Backends:
  * `torch`: plain PyTorch matmuls with an explicit mask, piece after piece. Runs anywhere
    (the CPU CI uses it in float64), and is the reference every faster backend is checked
    against at start-up.
  * `sdpa-varlen` (`--backend sdpa`, tried first): PyTorch's bundled FlashAttention as one
    varlen launch (`_flash_attention_forward`/`_backward` with int32 offsets), GQA native.
    CUDA only.
  * `sdpa` (its fallback when this PyTorch's varlen op fails the self-test): the dense ATen
    ops that return the log-sum-exp (`_scaled_dot_product_flash_attention` and its
    backward), one launch per piece, GQA by expanding K/V heads.
The calibration times the same backend object, so the profile and the replay agree.
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


def _merged(l_old, o_old, lse, o, inv=None):
    """Accumulator rows (l_old [U,H], o_old [U,H,d]) after adding partials (lse [N,H],
    o [N,H,d]) by log-sum-exp; partial i lands on row inv[i] (None: on row i, N == U)."""
    lse, o = lse.to(l_old.dtype), o.to(o_old.dtype)
    m = (torch.maximum(l_old, lse) if inv is None
         else l_old.scatter_reduce(0, inv.unsqueeze(1).expand_as(lse), lse, "amax"))
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a = torch.exp(l_old - m_safe)
    b = torch.exp(lse - (m_safe if inv is None else m_safe.index_select(0, inv)))
    add = (lambda x, y: x + y) if inv is None else (lambda x, y: x.index_add(0, inv, y))
    s = add(a, b)
    num = add(o_old * a.unsqueeze(-1), o * b.unsqueeze(-1))
    s_safe = torch.where(s == 0, torch.ones_like(s), s)
    return num / s_safe.unsqueeze(-1), torch.where(s == 0, l_old, m_safe + torch.log(s_safe))


def merge_into(acc_o, acc_l, o, lse):
    """Merge a partial (o [L,H,d], lse [L,H]) into accumulators of the same rows, in place."""
    o_new, l_new = _merged(acc_l, acc_o, lse, o)
    acc_o.copy_(o_new)
    acc_l.copy_(l_new)


def merge_rows(acc_o, acc_l, u, inv, o, lse):
    """Merge partials (o [N,H,d], lse [N,H]) into accumulators (acc_o [T,H,d], acc_l [T,H]) in
    place, partial i into row u[inv[i]] (`u` distinct rows: two pieces of one query row in a
    launch share it and merge together, in any order up to rounding)."""
    o_new, l_new = _merged(acc_l.index_select(0, u), acc_o.index_select(0, u), lse, o, inv)
    acc_o.index_copy_(0, u, o_new)
    acc_l.index_copy_(0, u, l_new)


def _expand(kv, group):
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def _segments(cu_q, cu_k):
    return [(cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]) for i in range(len(cu_q) - 1)]


class PieceByPiece:
    """Varlen launches run as one launch per piece: for backends whose kernel takes one dense
    tile (the reference, and the dense sdpa fallback)."""

    def forward_varlen(self, q, k, v, cu_q, cu_k, causal, scale):
        """q [Tq,H,d], k/v [Tk,Hk,d] -> (o [Tq,H,d] float, lse [Tq,H])."""
        outs = [self.forward(q[a:b], k[c:e], v[c:e], causal, scale) for a, b, c, e in _segments(cu_q, cu_k)]
        return torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs])

    def backward_varlen(self, q, k, v, do, lse, delta, cu_q, cu_k, causal, scale):
        """-> (dq [Tq,H,d], dk, dv [Tk,Hk,d]) in float, each piece's gradient in its own rows."""
        gs = [self.backward(q[a:b], k[c:e], v[c:e], do[a:b], lse[a:b], delta[a:b], causal, scale)
              for a, b, c, e in _segments(cu_q, cu_k)]
        return tuple(torch.cat([g[i] for g in gs]) for i in range(3))


class TorchAttention(PieceByPiece):
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


def _o_equivalent(do, delta, dtype):
    """An output O with rowsum(dO * O) == delta, for kernels that recompute delta from (dO, O):
    the merged O lives on another rank, and only delta enters the gradient."""
    dof = do.float()
    # Scaled by the row's largest |dO| first, so the square neither underflows nor overflows (a
    # row with |dO| under 1e-15 lost its delta to a clamp; review before the GPU session).
    amax = dof.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    u = dof / amax
    nrm = (u * u).sum(-1, keepdim=True).clamp_min(1.0)
    return (u * (delta.float().unsqueeze(-1) / amax / nrm)).to(dtype)


class SdpaAttention(PieceByPiece):
    """PyTorch's bundled FlashAttention (CUDA), through the dense ATen ops that expose the
    lse: one launch per piece."""

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
        qb = q.transpose(0, 1).unsqueeze(0)
        kb = _expand(k, g).transpose(0, 1).unsqueeze(0).contiguous()
        vb = _expand(v, g).transpose(0, 1).unsqueeze(0).contiguous()
        o_eq = _o_equivalent(do, delta, q.dtype)
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


class SdpaVarlenAttention:
    """PyTorch's bundled FlashAttention as one varlen launch over all pieces
    (`_flash_attention_forward`/`_backward`, int32 offsets, GQA native). Each piece is a full
    rectangle or a square on the diagonal, so the kernel's causal alignment does not matter.

    The varlen lse is [H, total_q] from PyTorch 2.7 on (bundled FlashAttention >= 2.6); 2.4-2.6
    pad it as [pieces, H, max_q], in the forward's output and in the backward's input (review
    before the GPU session: the self-test failed there, and the dense fallback ran)."""

    name = "sdpa-varlen"

    def __init__(self):
        self._cu, self._rows_of, self._padded = {}, {}, None

    def _offsets(self, cu, device):
        """The offsets on the device and the longest piece, made once per offset list: a copy
        from the host synchronises the stream, and every timed run repeats the warm-up's
        launches."""
        key = (tuple(cu), str(device))
        if key not in self._cu:
            self._cu[key] = (torch.tensor(cu, dtype=torch.int32, device=device),
                             max(b - a for a, b in zip(cu, cu[1:])))
        return self._cu[key]

    def _rows(self, cu, device):
        """(piece, position in its piece) of every row, for the padded lse layout."""
        key = (tuple(cu), str(device))
        if key not in self._rows_of:
            lens = torch.tensor([b - a for a, b in zip(cu, cu[1:])])
            piece = torch.repeat_interleave(torch.arange(len(lens)), lens)
            pos = torch.arange(cu[-1]) - torch.tensor(cu[:-1], dtype=torch.int64)[piece]
            self._rows_of[key] = (piece.to(device), pos.to(device))
        return self._rows_of[key]

    def _padded_lse(self, device):
        """Whether this PyTorch's varlen lse is padded: known from a forward, else one tiny
        launch asks."""
        if self._padded is None:
            x = torch.zeros(1, 1, 8, dtype=torch.bfloat16, device=device)
            z = torch.tensor([0, 1], dtype=torch.int32, device=device)
            self._padded = torch.ops.aten._flash_attention_forward(x, x, x, z, z, 1, 1, 0.0, False, False)[1].dim() == 3
        return self._padded

    def forward_varlen(self, q, k, v, cu_q, cu_k, causal, scale):
        cq, mq = self._offsets(cu_q, q.device)
        ck, mk = self._offsets(cu_k, q.device)
        o, lse = torch.ops.aten._flash_attention_forward(q, k, v, cq, ck, mq, mk, 0.0, causal, False, scale=scale)[:2]
        self._padded = lse.dim() == 3
        if self._padded:  # [pieces, H, max_q]
            piece, pos = self._rows(cu_q, q.device)
            return o, lse[piece, :, pos].float()
        return o, lse.transpose(0, 1).float()  # [H, Tq]

    def backward_varlen(self, q, k, v, do, lse, delta, cu_q, cu_k, causal, scale):
        cq, mq = self._offsets(cu_q, q.device)
        ck, mk = self._offsets(cu_k, q.device)
        o_eq = _o_equivalent(do, delta, q.dtype)
        if self._padded_lse(q.device):
            piece, pos = self._rows(cu_q, q.device)
            lse_k = torch.zeros(len(cu_q) - 1, lse.shape[1], mq, dtype=torch.float32, device=q.device)
            lse_k[piece, :, pos] = lse.float()
        else:
            lse_k = lse.float().transpose(0, 1).contiguous()
        seed = torch.zeros((), dtype=torch.int64, device=q.device)  # read only with dropout
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            do.contiguous(), q, k, v, o_eq, lse_k, cq, ck, mq, mk, 0.0, causal, seed, seed, scale=scale
        )
        return dq.float(), dk.float(), dv.float()

    def forward(self, q, k, v, causal, scale):
        return self.forward_varlen(q, k, v, [0, q.shape[0]], [0, k.shape[0]], causal, scale)

    def backward(self, q, k, v, do, lse, delta, causal, scale):
        return self.backward_varlen(q, k, v, do, lse, delta, [0, q.shape[0]], [0, k.shape[0]], causal, scale)


# (query rows, query heads, K/V heads, head dim) of the self-test: a small GQA problem, and one
# with the session's head dim and pieces over several 128-row kernel blocks.
SELF_TEST_SHAPES = ((96, 4, 2, 64), (384, 8, 2, 128))


def self_test(backend, device, dtype, tol=3e-2):
    """Check `backend` against the reference on each of SELF_TEST_SHAPES: both piece kinds,
    fwd and bwd, one piece and a varlen launch of three pieces of different lengths (one
    repeating another's query rows). Returns None when it agrees, else a message saying what
    differed."""
    ref = TorchAttention()
    gen = torch.Generator(device="cpu").manual_seed(7)
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    try:
        for L, H, Hk, d in SELF_TEST_SHAPES:
            q, k, v, do = mk(L, H, d), mk(L, Hk, d), mk(L, Hk, d), mk(L, H, d)
            scale = 1.0 / math.sqrt(d)
            # Varlen: pieces of L, 5L/12 and L/4 query rows over the first 2L/3 rows again;
            # causal pieces are squares (the replay's), full ones of any shape.
            n = L + 2 * L // 3
            qv, kv_, vv, dov = (torch.cat([x, x[:2 * L // 3]]) for x in (q, k, v, do))
            for causal in (False, True):
                cq = [0, L, L + 5 * L // 12, n]
                ck = cq if causal else [0, L, L + L // 4, n]
                o1, l1 = backend.forward(q, k, v, causal, scale)
                o0, l0 = ref.forward(q, k, v, causal, scale)
                delta = (do.float() * o0.float()).sum(-1)
                g1 = backend.backward(q, k, v, do, l0, delta, causal, scale)
                g0 = ref.backward(q, k, v, do, l0, delta, causal, scale)
                ov0, lv0 = ref.forward_varlen(qv, kv_, vv, cq, ck, causal, scale)
                ov1, lv1 = backend.forward_varlen(qv, kv_, vv, cq, ck, causal, scale)
                dv_ = (dov.float() * ov0.float()).sum(-1)
                gv1 = backend.backward_varlen(qv, kv_, vv, dov, lv0, dv_, cq, ck, causal, scale)
                gv0 = ref.backward_varlen(qv, kv_, vv, dov, lv0, dv_, cq, ck, causal, scale)
                pairs = [("out", o1, o0), ("lse", l1, l0)] + list(zip(("dq", "dk", "dv"), g1, g0))
                pairs += [("varlen out", ov1, ov0), ("varlen lse", lv1, lv0)]
                pairs += list(zip(("varlen dq", "varlen dk", "varlen dv"), gv1, gv0))
                for name, a, b in pairs:
                    err = (a.float() - b.float()).abs().max().item()
                    if not err <= tol * max(1.0, b.float().abs().max().item()):
                        return (f"{backend.name} {name} (causal={causal}, {L} rows, {H}:{Hk} heads, "
                                f"head dim {d}) differs from the reference by {err:.3g}")
    except Exception as e:  # an op missing or with another signature in this PyTorch
        return f"{backend.name} failed: {type(e).__name__}: {e}"
    return None


def choose_backend(name, device, dtype, log):
    """The backend to use: `torch`, `sdpa` (the varlen launch when its self-test passes, else
    the dense op piece by piece), or `auto` (sdpa on CUDA, else or when both fail, torch)."""
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention()
    if device.type != "cuda":
        raise SystemExit(f"error: backend {name} needs a CUDA device")
    varlen = SdpaVarlenAttention()
    problem = self_test(varlen, device, dtype)
    if problem is None:
        return varlen
    log(f"warning: {problem}; trying the dense sdpa op, one launch per piece")
    dense = SdpaAttention()
    problem = self_test(dense, device, dtype)
    if problem is None:
        return dense
    if name == "sdpa":
        raise SystemExit(f"error: {problem}")
    log(f"warning: {problem}; falling back to the plain PyTorch backend")
    return TorchAttention()
