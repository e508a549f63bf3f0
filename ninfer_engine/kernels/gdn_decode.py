"""One-token Gated DeltaNet recurrent update for all value heads (model-math.md §2.1 step 6).

Inputs for B sequences: q, k `[B, nk, dk]` (raw; L2-normalised here), v `[B, nv, dv]`,
g `[B, nv]` (log decay, α = e^g), beta `[B, nv]`, state `[B, nv, dk, dv]` fp32 updated in place.
Value head j reads q/k head `j // (nv/nk)`. Returns o `[B, nv, dv]` fp32, o = Sᵀ q / √dk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.gdn import l2_normalize, recurrent_gated_delta
from ._dispatch import use_triton


def gdn_decode_ref(q, k, v, g, beta, state):
    """Torch reference built on the model's `recurrent_gated_delta`; updates `state`."""
    r = v.shape[1] // q.shape[1]
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for b in range(q.shape[0]):
        qb = l2_normalize(q[b].float()).repeat_interleave(r, 0)[None]
        kb = l2_normalize(k[b].float()).repeat_interleave(r, 0)[None]
        o, s = recurrent_gated_delta(qb, kb, v[b].float()[None], g[b].float()[None],
                                     beta[b].float()[None], state[b])
        out[b] = o[0]
        state[b] = s
    return out


@triton.jit
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr, scale,
                       NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BV: tl.constexpr):
    pid = tl.program_id(0)  # b * NV + j
    vb = tl.program_id(1)
    b = pid // NV
    j = pid % NV
    kh = b * NK + j // (NV // NK)
    dk = tl.arange(0, DK)
    dv = vb * BV + tl.arange(0, BV)
    q = tl.load(q_ptr + kh * DK + dk).to(tl.float32)
    k = tl.load(k_ptr + kh * DK + dk).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    v = tl.load(v_ptr + pid * DV + dv).to(tl.float32)
    alpha = tl.exp(tl.load(g_ptr + pid).to(tl.float32))
    beta = tl.load(beta_ptr + pid).to(tl.float32)
    sp = s_ptr + pid * DK * DV + dk[:, None] * DV + dv[None, :]
    s = tl.load(sp) * alpha
    # the delta error reads the already-decayed state
    u = beta * (v - tl.sum(s * k[:, None], axis=0))
    s = s + k[:, None] * u[None, :]
    tl.store(sp, s)
    tl.store(o_ptr + pid * DV + dv, tl.sum(s * q[:, None], axis=0))


def gdn_decode_triton(q, k, v, g, beta, state, block_v=32):
    """Triton path: one program per (sequence, value head, block of `block_v` value dims)."""
    B, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    o = torch.empty(B, nv, dv, dtype=torch.float32, device=v.device)
    _gdn_decode_kernel[(B * nv, dv // block_v)](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
        state, o, dk**-0.5, NK=nk, NV=nv, DK=dk, DV=dv, BV=block_v, num_warps=4)
    return o


def gdn_decode(q, k, v, g, beta, state):
    """Dispatching entry point; see the module docstring."""
    return (gdn_decode_triton if use_triton(q) else gdn_decode_ref)(q, k, v, g, beta, state)
