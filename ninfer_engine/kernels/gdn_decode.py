"""One-token Gated DeltaNet recurrent update for all value heads (model-math.md §2.1 step 6).

Inputs for B sequences: q, k `[B, nk, dk]` (raw; L2-normalised here), v `[B, nv, dv]`,
g `[B, nv]` (log decay, α = e^g), beta `[B, nv]`, state `[S, nv, dk, dv]` fp32 updated in place:
row b continues state row `index[b]` (a state-slot pool addressed by index, as vLLM's
`state_indices`), or row b itself when `index` is None (S = B).
Value head j reads q/k head `j // (nv/nk)`. Returns o `[B, nv, dv]` fp32, o = Sᵀ q / √dk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.gdn import l2_normalize, recurrent_gated_delta
from ._dispatch import use_triton
from .pdl import pdl_launch, pdl_release, pdl_wait


def gdn_decode_ref(q, k, v, g, beta, state, index=None):
    """Torch reference built on the model's `recurrent_gated_delta`; updates `state`."""
    r = v.shape[1] // q.shape[1]
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    rows = range(q.shape[0]) if index is None else index.tolist()
    for b, row in enumerate(rows):
        qb = l2_normalize(q[b].float()).repeat_interleave(r, 0)[None]
        kb = l2_normalize(k[b].float()).repeat_interleave(r, 0)[None]
        o, s = recurrent_gated_delta(qb, kb, v[b].float()[None], g[b].float()[None],
                                     beta[b].float()[None], state[row])
        out[b] = o[0]
        state[row] = s
    return out


@triton.jit
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, idx_ptr, o_ptr, scale,
                       NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr, EVEN: tl.constexpr,
                       INDEXED: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    pid = tl.program_id(0)  # b * NV + j
    vb = tl.program_id(1)
    b = pid // NV
    j = pid % NV
    kh = b * NK + j // (NV // NK)
    dk = tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    qp = q_ptr + kh * DK + dk
    kp = k_ptr + kh * DK + dk
    vp = v_ptr + pid * DV + dv
    if INDEXED:  # the row's state slot
        srow = tl.load(idx_ptr + b).to(tl.int64) * NV + j
    else:
        srow = pid.to(tl.int64)
    sp = s_ptr + srow * DK * DV + dk[:, None] * DV + dv[None, :]
    if EVEN:  # BK == DK and BV divides DV: the real shapes, no masks
        q = tl.load(qp).to(tl.float32)
        k = tl.load(kp).to(tl.float32)
        v = tl.load(vp).to(tl.float32)
        s = tl.load(sp)
    else:  # a dk that is not a power of two, or a dv tail (tiny test shapes)
        kmask = dk < DK
        vmask = dv < DV
        smask = kmask[:, None] & vmask[None, :]
        q = tl.load(qp, mask=kmask, other=0.0).to(tl.float32)
        k = tl.load(kp, mask=kmask, other=0.0).to(tl.float32)
        v = tl.load(vp, mask=vmask, other=0.0).to(tl.float32)
        s = tl.load(sp, mask=smask, other=0.0)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    alpha = tl.exp(tl.load(g_ptr + pid).to(tl.float32))
    beta = tl.load(beta_ptr + pid).to(tl.float32)
    s = s * alpha
    # the delta error reads the already-decayed state
    u = beta * (v - tl.sum(s * k[:, None], axis=0))
    s = s + k[:, None] * u[None, :]
    o = tl.sum(s * q[:, None], axis=0)
    if EVEN:
        tl.store(sp, s)
        tl.store(o_ptr + pid * DV + dv, o)
    else:
        tl.store(sp, s, mask=smask)
        tl.store(o_ptr + pid * DV + dv, o, mask=vmask)


def gdn_decode_triton(q, k, v, g, beta, state, index=None, block_v=32):
    """Triton path: one program per (sequence, value head, block of `block_v` value dims).

    `block_v` is capped at dv (rounded up to a power of two) so small heads still get a
    program; a dv that `block_v` does not divide, or a dk that is not a power of two, takes
    the masked variant (the real shapes, dk = dv = 128, stay unmasked)."""
    B, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    assert nv % nk == 0 and state.shape[1:] == (nv, dk, dv) and state.dtype == torch.float32
    assert state.is_contiguous() and (state.shape[0] == B if index is None else
                                      index.shape == (B,) and index.dtype == torch.long)
    block_v = min(block_v, triton.next_power_of_2(dv))
    block_k = triton.next_power_of_2(dk)
    o = torch.empty(B, nv, dv, dtype=torch.float32, device=v.device)
    _gdn_decode_kernel[(B * nv, triton.cdiv(dv, block_v))](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
        state, state if index is None else index, o, dk**-0.5, NK=nk, NV=nv, DK=dk, DV=dv,
        BK=block_k, BV=block_v, EVEN=block_k == dk and dv % block_v == 0,
        INDEXED=index is not None, num_warps=4, **pdl_launch(state))
    return o


def gdn_decode(q, k, v, g, beta, state, index=None):
    """Dispatching entry point; see the module docstring."""
    fn = gdn_decode_triton if use_triton(q) else gdn_decode_ref
    return fn(q, k, v, g, beta, state, index)
