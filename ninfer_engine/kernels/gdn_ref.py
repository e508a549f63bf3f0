"""Torch reference math of the Gated DeltaNet rule (model-math.md §2.1 steps 6–7): the token
recurrence, the chunked (WY/UT) form and its per-chunk precompute. The model's layer
(`models.gdn`) runs these on the CPU; the Triton kernels (`gdn_decode`, `gdn_prep`,
`gdn_chunk`) are checked against them and take `chunk_prep` for their fp32 path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dim (eps inside the sum, as FLA and HF)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_gated_delta(q, k, v, g, beta, state, trail: list | None = None):
    """Token-by-token gated delta rule (§2.1 step 6).

    q, k: [T, nv, dk] fp32, L2-normalised, already expanded to value heads; v: [T, nv, dv] fp32;
    g, beta: [T, nv] fp32; state: [nv, dk, dv] fp32. Returns (o [T, nv, dv], new state);
    `trail`, when given, gets the state after each token.
    """
    q = q / q.shape[-1] ** 0.5
    out = torch.empty_like(v)
    s = state
    for t in range(q.shape[0]):
        s = s * g[t].exp()[:, None, None]
        # the delta error reads the already-decayed state
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
        s = s + k[t][:, :, None] * u[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", s, q[t])
        if trail is not None:
            trail.append(s)
    return out, s


def chunk_prep(q, k, v, g, beta, chunk: int = CHUNK):
    """The per-chunk parallel part of the chunked (WY/UT) rule (§2.1 step 7), for all heads and
    chunks at once; the sequential part is `chunked_gated_delta`'s loop (torch) or
    `kernels.gdn_chunk`'s kernel (Triton).

    T is zero-padded to a multiple of `chunk`; padded rows have k = 0, beta = 0, g = 0, so they
    leave the state untouched. Returns (w [nv, n, C, dk], u [nv, n, C, dv], qd [nv, n, C, dk],
    ke [nv, n, C, dk], p [nv, n, C, C], cd [nv, n]) and n: per chunk, `v' = u − w S`,
    `o = qd S + p v'`, `S ← cd·S + keᵀ v'`. fp32, any strides.
    """
    T, nv, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    n = (T + pad) // chunk

    def blocks(x):  # [T, nv, ...] -> [nv, n, chunk, ...], a view when T fills the chunks
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, 0, 0, pad))
        return x.reshape(n, chunk, nv, *x.shape[2:]).transpose(0, 2).transpose(1, 2)

    # 1/√dk is folded into P and Q e^γ instead of a pass over q, and the [C, C]
    # intermediates are updated in place (a prefill's are ~100 MB each)
    scale = dk**-0.5
    q, k, v = blocks(q), blocks(k), blocks(v)
    g, beta = blocks(g), blocks(beta)  # [nv, n, chunk]
    gam = g.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # γ_i − γ_j summed directly over s in (j, i]: subtracting two large cumsums loses fp32 bits
    seg = g[..., :, None].expand(*g.shape, chunk).masked_fill(~causal.tril(-1), 0).cumsum(-2)
    # e^{γ_i − γ_j} for j ≤ i, 0 above the diagonal (masked before exp: no overflow)
    decay = seg.masked_fill_(~causal, float("-inf")).exp_()
    kb = k * beta[..., None]
    a = (kb @ k.transpose(-1, -2)).mul_(decay).tril_(-1)
    a.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # I + A
    # (I + A) is unit lower triangular: U = (I+A)^-1 (β v), W = (I+A)^-1 (β e^γ k), as one
    # solve over both right-hand sides
    eg = gam.exp()
    rhs = torch.cat([v * beta[..., None], kb * eg[..., None]], -1)
    uw = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u, w = uw[..., :dv], uw[..., dv:]
    p = (q @ k.transpose(-1, -2)).mul_(decay).mul_(scale)
    qd = q * (eg * scale)[..., None]
    ke = k * decay[..., -1, :, None]  # e^{γ_C − γ_j}
    cd = eg[..., -1]  # [nv, n]
    return (w, u, qd, ke, p, cd), n


def chunked_gated_delta(q, k, v, g, beta, state, chunk: int = CHUNK):
    """Chunked (WY/UT) gated delta rule (§2.1 step 7); same contract as `recurrent_gated_delta`:
    `chunk_prep`, then the chunks in order."""
    T, nv, dv = v.shape
    (w, u, qd, ke, p, cd), n = chunk_prep(q, k, v, g, beta, chunk)
    out = torch.empty(nv, n, chunk, dv, dtype=q.dtype, device=q.device)
    s = state
    for i in range(n):
        v_corr = u[:, i] - w[:, i] @ s
        out[:, i] = qd[:, i] @ s + p[:, i] @ v_corr
        s = s * cd[:, i, None, None] + ke[:, i].transpose(-1, -2) @ v_corr
    out = out.transpose(1, 2).transpose(0, 2).reshape(n * chunk, nv, dv)[:T]
    return out, s
