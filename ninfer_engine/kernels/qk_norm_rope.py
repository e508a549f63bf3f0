"""The decode step's per-head q/k RMSNorm and rotary embedding, both head kinds in one launch.

`HybridStep._attn` (models/qwen3_5_step.py) normalizes q and k per head with zero-centred weights
(`x̂·(1+w)`, `kernels.rmsnorm`) and then rotates them (`kernels.rotary`): four launches per
attention layer. `qk_norm_rope(qkv, nq, nkv, d, q_norm, k_norm, eps, positions, rd, theta)`
does all four in one and returns new contiguous q [B, nq, d] and k [B, nkv, d] in qkv's dtype;
given a plain KV pool's rows (`kv_rows`, `slots`) it writes k and v into them instead (the
step's two `index_copy_` launches per attention layer folded in).

Layout: qkv [B, W] is the fused input projection, columns q (nq·d) | gate (nq·d) | k (nkv·d) |
v (nkv·d), W = 2·nq·d + 2·nkv·d; q is read from column 0 and k from column 2·nq·d. Rows may
be strided (the last dim must be contiguous); qkv is only read, so the gate and v columns
stay views for the caller. positions [B] int. The grid is (B, nq + nkv): program (b, h) does
q head h with q_norm when h < nq, else k head h − nq with k_norm. d must be a power of two (a
head is one register block; real models have d = 256, the test models 16 or 32) and rd/2 too.

Rounding: as the unfused path. The norm's statistics are fp32 and the normed value is rounded
to qkv's dtype (what `rms_norm` stores); the rotation then computes in fp32 from that rounded
value with the `rotary.inv_freq` table and rounds once more; dims [rd, d) are the rounded
normed values. The Triton path repeats `rms_norm_triton` then `rope_triton` operation for
operation (same block, warp count and expressions), so it is meant to be bit-identical to them
(tested under the interpreter); against the torch reference it differs only where `rsqrt`, the
reduction order or cos/sin move a value across a rounding boundary. Under TRITON_INTERPRET=1
fp32 -> bf16 casts truncate (Triton 3.9), so there all Triton paths differ from torch more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton
from .pdl import pdl_launch, pdl_release, pdl_wait
from .rmsnorm import rms_norm_ref
from .rotary import inv_freq, rope_ref


def _check(qkv, nq, nkv, d, rd):
    assert qkv.dim() == 2 and qkv.shape[1] == 2 * (nq + nkv) * d, (tuple(qkv.shape), nq, nkv, d)
    assert d & (d - 1) == 0, f"head dim {d} must be a power of two"
    assert rd % 2 == 0 and 2 <= rd <= d and (rd // 2) & (rd // 2 - 1) == 0, (rd, d)


def qk_norm_rope_ref(qkv, nq, nkv, d, q_norm, k_norm, eps, positions, rd, theta):
    """Torch reference: `_attn`'s zero-centred q/k norms, then the partial NeoX rotary."""
    _check(qkv, nq, nkv, d, rd)
    B = qkv.shape[0]
    q = qkv[:, : nq * d].reshape(B * nq, d)
    k = qkv[:, 2 * nq * d : (2 * nq + nkv) * d].reshape(B * nkv, d)
    q, _ = rms_norm_ref(q, q_norm, eps, None, True)
    k, _ = rms_norm_ref(k, k_norm, eps, None, True)
    return (rope_ref(q.view(B, nq, d), positions, rd, theta),
            rope_ref(k.view(B, nkv, d), positions, rd, theta))


@triton.jit
def _norm_rope_head(src, dst, w_ptr, inv_ptr, pos, eps, D: tl.constexpr, HALF: tl.constexpr):
    offs = tl.arange(0, D)
    xf = tl.load(src + offs).to(tl.float32)
    # the same expression as _rms_norm_kernel, so the fused result matches it bit for bit
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + offs).to(tl.float32) + 1.0
    # round to the activation dtype as rms_norm stores it, then rotate from that value
    y = (xf * inv * w).to(dst.dtype.element_ty)
    tl.store(dst + offs, y, mask=offs >= 2 * HALF)
    # the rotated halves again from memory (cache hits): registers cannot be indexed by lane
    i = tl.arange(0, HALF)
    wa = tl.load(w_ptr + i).to(tl.float32) + 1.0
    wb = tl.load(w_ptr + HALF + i).to(tl.float32) + 1.0
    a = tl.load(src + i).to(tl.float32)
    b = tl.load(src + HALF + i).to(tl.float32)
    a = (a * inv * wa).to(dst.dtype.element_ty).to(tl.float32)
    b = (b * inv * wb).to(dst.dtype.element_ty).to(tl.float32)
    ang = pos * tl.load(inv_ptr + i)
    c, s = tl.cos(ang), tl.sin(ang)
    tl.store(dst + i, (a * c - b * s).to(dst.dtype.element_ty))
    tl.store(dst + HALF + i, (b * c + a * s).to(dst.dtype.element_ty))


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, q_ptr, k_ptr, qw_ptr, kw_ptr, pos_ptr, inv_ptr, row_stride,
                         k_col, nq, nkv, eps, kr_ptr, vr_ptr, slot_ptr, D: tl.constexpr,
                         HALF: tl.constexpr, WRITE_KV: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = qkv_ptr + b * row_stride
    # fp32 position as rope_triton converts it
    pos = tl.load(pos_ptr + b).to(tl.float32)
    kv_row = 0  # with WRITE_KV k and v go straight into their token slot's pool rows
    if WRITE_KV:
        kv_row = tl.load(slot_ptr + b) * nkv
    # one branch per head kind: q_norm and k_norm may have different dtypes
    if h < nq:
        _norm_rope_head(row + h * D, q_ptr + (b * nq + h) * D, qw_ptr, inv_ptr, pos, eps,
                        D, HALF)
    elif h < nq + nkv:
        kh = h - nq
        if WRITE_KV:
            dst = kr_ptr + (kv_row + kh) * D
        else:
            dst = k_ptr + (b * nkv + kh) * D
        _norm_rope_head(row + k_col + kh * D, dst, kw_ptr, inv_ptr, pos, eps, D, HALF)
    else:  # WRITE_KV only: v head h - nq - nkv, copied as it is
        vh = h - nq - nkv
        offs = tl.arange(0, D)
        v = tl.load(row + k_col + (nkv + vh) * D + offs)
        tl.store(vr_ptr + (kv_row + vh) * D + offs, v)


def qk_norm_rope_triton(qkv, nq, nkv, d, q_norm, k_norm, eps, positions, rd, theta,
                        kv_rows=None, slots=None):
    """Triton path: one program per (row, head), the head in registers.

    `kv_rows` = (K, V) `[slots, nkv, d]` in qkv's dtype (a plain KV pool's rows) and `slots`
    [B]: the rotated k and the v columns are written into row `slots[b]` of K and V (what the
    pool's `index_copy_` would write, without its two launches) and k is returned as None."""
    _check(qkv, nq, nkv, d, rd)
    assert qkv.stride(1) == 1, "qkv's columns must be contiguous"
    B = qkv.shape[0]
    q = torch.empty(B, nq, d, dtype=qkv.dtype, device=qkv.device)
    write = kv_rows is not None
    k = None if write else torch.empty(B, nkv, d, dtype=qkv.dtype, device=qkv.device)
    kr, vr = kv_rows if write else (q, q)  # pointers the kernel ignores without WRITE_KV
    if write:
        assert kr.shape[1:] == vr.shape[1:] == (nkv, d) and kr.dtype == vr.dtype == qkv.dtype
        assert kr.is_contiguous() and vr.is_contiguous() and slots.shape == (B,)
    _qk_norm_rope_kernel[(B, nq + nkv * (2 if write else 1))](
        qkv, q, q if write else k, q_norm, k_norm, positions,
        inv_freq(rd, theta, qkv.device), qkv.stride(0), 2 * nq * d, nq, nkv, eps, kr, vr,
        slots if write else q,
        D=d, HALF=rd // 2, WRITE_KV=write,
        # rms_norm_triton's warp count for a row of d, so the sum reduces in the same order
        num_warps=min(16, max(1, d // 512)), **pdl_launch(qkv))
    return q, k


def qk_norm_rope(qkv, nq, nkv, d, q_norm, k_norm, eps, positions, rd, theta):
    """Dispatching entry point; see the module docstring."""
    fn = qk_norm_rope_triton if use_triton(qkv) else qk_norm_rope_ref
    return fn(qkv, nq, nkv, d, q_norm, k_norm, eps, positions, rd, theta)
