"""Batch-1..16 matmul `y = x Wᵀ` with quantised weights, dequantisation fused into the loads.

Weight encodings, kept as plain tensors:
* row-scaled: codes `[N, K]` (float8_e4m3fn, ninfer-format.md §2.3 fp8-row) and one scale per
  row `[N]`;
* group-scaled: codes `[N, K]` (int8, or float8_e4m3fn) and one scale per G consecutive K
  `[N, K // G]`, G a power of two ≥ 16: q8_g32 (§2.1's Q8 values), and the fp8 form the engine
  repacks Q4/Q5 groups into (their codes are exact in e4m3; `models.packed`).
x is `[B, K]` bf16, y `[B, N]` in x's dtype; accumulation is fp32. The Triton path tiles N,
splits K across programs when N alone cannot fill the GPU, and feeds bf16 tiles to `tl.dot`;
a group-scaled weight takes K tiles of exactly one group, so each tile's partial sums are
scaled by one value per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, use_triton

Q8_GROUP = 32


def quantize_fp8_row(w):
    """[N, K] float -> (e4m3 codes, bf16 row scales), absmax of each row mapped to 448."""
    scale = (w.float().abs().amax(1) / 448.0).clamp_min(1e-12).to(torch.bfloat16)
    codes = (w.float() / scale.float()[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes, scale


def quantize_q8_g32(w):
    """[N, K] float -> (int8 codes, fp16 scales [N, K // 32]), symmetric absmax per group."""
    g = w.float().unflatten(1, (-1, Q8_GROUP))
    scale = (g.abs().amax(-1) / 127.0).clamp_min(1e-8).half()
    codes = torch.round(g / scale.float()[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes.flatten(1), scale


def dequantize(codes, scale):
    """Codes and scales of either encoding -> fp32 [N, K]."""
    if scale.dim() == 1:
        return codes.float() * scale.float()[:, None]
    return (codes.float().unflatten(1, (scale.shape[1], -1)) * scale.float()[..., None]).flatten(1)


def dequant_gemv_ref(x, codes, scale):
    """Torch reference: dequantise the whole matrix, fp32 matmul, cast to x's dtype."""
    return (x.float() @ dequantize(codes, scale).t()).to(x.dtype)


@triton.jit
def _dequant_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, B, N, K, k_per_split,
                         GROUPED: tl.constexpr, DOT: tl.constexpr, BB: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr):
    nb = tl.program_id(0)
    sk = tl.program_id(1)
    rows = nb * BN + tl.arange(0, BN)
    bat = tl.arange(0, BB)
    kk = tl.arange(0, BK)
    nmask = rows < N
    acc = tl.zeros([BB, BN], tl.float32)
    k0 = sk * k_per_split
    for k in range(k0, k0 + k_per_split, BK):
        cols = k + kk
        x = tl.load(x_ptr + bat[:, None] * K + cols[None, :], mask=(bat < B)[:, None], other=0.0)
        # no `other`: an integer fill cannot be cast to fp8, and masked rows are never stored
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=nmask[:, None])
        part = tl.dot(x.to(DOT), tl.trans(w.to(tl.float32).to(DOT)))
        if GROUPED:  # the tile is one scale group: one factor per row
            sc = tl.load(s_ptr + rows * (K // BK) + k // BK, mask=nmask, other=0.0)
            part = part * sc.to(tl.float32)[None, :]
        acc += part
    if not GROUPED:
        acc = acc * tl.load(s_ptr + rows, mask=nmask).to(tl.float32)[None, :]
    out = y_ptr + (sk * B + bat[:, None]) * N + rows[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(bat < B)[:, None] & nmask[None, :])


def split_k(n_blocks, K, block_k, sms=132):
    """K splits so that about two waves of programs cover the SMs; each split whole BK tiles."""
    tiles = K // block_k
    want = max(1, -(-2 * sms // n_blocks))
    split = min(want, tiles)
    while tiles % split:  # every split gets the same number of tiles
        split -= 1
    return split


def dequant_gemv_triton(x, codes, scale, block_n=64, block_k=256, num_warps=4, num_stages=3):
    """Triton path; K must be a multiple of `block_k` (true for every model matrix here), or of
    a smaller power of two of at least 16, which then replaces it.

    The default tile won 3 of 4 shapes of the H200 sweep in bench/results/h200-kernels.json."""
    B, K = x.shape
    N = codes.shape[0]
    if scale.dim() == 2:  # group-scaled: one group per K tile
        block_k = K // scale.shape[1]
    # small matrices: the largest power of two dividing K (K = 96 takes BK = 32); tl.arange
    # needs a power of two and tl.dot at least 16. Real K are multiples of 256: unchanged.
    block_k = min(block_k, K & -K)
    assert K % block_k == 0 and block_k >= 16 and B <= 16
    n_blocks = triton.cdiv(N, block_n)
    split = split_k(n_blocks, K, block_k)
    y = torch.empty((split, B, N), device=x.device,
                    dtype=x.dtype if split == 1 else torch.float32)
    _dequant_gemv_kernel[(n_blocks, split)](
        x.contiguous(), codes, scale, y, B, N, K, K // split, GROUPED=scale.dim() == 2,
        DOT=dot_dtype(),
        BB=16, BN=block_n, BK=block_k, num_warps=num_warps, num_stages=num_stages)
    return y[0] if split == 1 else y.sum(0).to(x.dtype)


def dequant_gemv(x, codes, scale):
    """Dispatching entry point; see the module docstring."""
    return (dequant_gemv_triton if use_triton(x) else dequant_gemv_ref)(x, codes, scale)
