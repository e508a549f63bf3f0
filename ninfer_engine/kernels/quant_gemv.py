"""Batch-1..16 matmul `y = x Wᵀ` over the artifact's packed weights, dequantised in the loads.

The weights are the planes of `codecs.planes` (ninfer-format.md §2.1, §2.2): row-split
Q4/Q5/Q6 (G = 64) and Q8 (G = 32) `(base, high, scale)` with `w = scale * signed(low | high << 4)`
(columns ≥ k dropped), and nvfp4 `(codes, row-major scale, d_w)` with
`w = e2m1(code) * e4m3(scale) / d_w`.

The Triton kernels read the code and high planes as 32-bit words, 8 lanes per code word (Q8:
4) and loop over the lanes, so every tile is 2-D `[BN rows, BKW words]`. Codes become floats
without int→float conversions: the sign bit is flipped (`v = q + 2^(b-1)`) and `v` is shifted
to the top of an fp32 mantissa, `f = 1 + v/2^b`, so `w = s*q = f*(2^b s) - 1.5*2^b*s` exactly;
the FMA variant sums `f*x` and `x` per word and applies the group scale once per word. nvfp4:
the E2M1 bits become fp32 bits worth `e2m1 * 2^-126` (fp16 bits for `tl.dot`). Variants:
register FMA reduction (`dot=False`, default at B ≤ 2) or `tl.dot` with x padded to 16 rows;
N is tiled and K split across programs only when N alone cannot fill the GPU.
The kernels are in `kernels.quant_gemv_kernels`.
"""

from __future__ import annotations

import math

import torch
import triton

from ..codecs import blockscale, rowsplit
from ._dispatch import dot_dtype, interpreting, use_triton
from .dequant_gemv_kernels import split_k
from .quant_gemv_kernels import _dequant_kernel, _gemv_kernel


def _spec(bits, group):
    spec = {4: "q4_g64_fp16", 5: "q5_g64_fp16", 6: "q6_g64_fp16", 8: "q8_g32_fp16"}[bits]
    assert rowsplit.FORMATS[spec].group == group, (bits, group)
    return rowsplit.FORMATS[spec]


# --------------------------------------------------------------------------------------------
# torch references (the planes come from `codecs.planes`)

def rowsplit_dequant_ref(base, high, scale, bits, group, k):
    """Torch reference: planes → fp32 `[N, k]`."""
    _spec(bits, group)
    n, gpr = scale.shape
    if bits == 8:
        q = base.view(torch.int8).float()
    else:
        u = torch.stack((base & 0xF, base >> 4), -1).reshape(n, gpr, 64).to(torch.int16)
        if bits > 4:
            shifts = torch.arange(0, 8, bits - 4, device=base.device, dtype=torch.uint8)
            h = (high.reshape(n, gpr, -1, 1) >> shifts) & ((1 << (bits - 4)) - 1)
            u = u | (h.reshape(n, gpr, 64).to(torch.int16) << 4)
        q = torch.where(u >= 1 << (bits - 1), u - (1 << bits), u).float()
    w = q.reshape(n, gpr, group) * scale.float()[..., None]
    return w.reshape(n, gpr * group)[:, :k]


def nvfp4_dequant_ref(codes, scale, d_w):
    """Torch reference: planes → fp32 `[N, K]` (the arithmetic of `blockscale.decode`)."""
    n = codes.shape[0]
    c = torch.stack((codes & 0xF, codes >> 4), -1).reshape(n, -1).long()
    s = scale.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
    d = torch.tensor(d_w, dtype=torch.float32, device=codes.device)
    return blockscale.E2M1.to(codes.device)[c] * s / d


# --------------------------------------------------------------------------------------------
# Triton


def _operands(planes):
    """Kernel operands of a plane tuple: int32 code words (rows are 4-byte aligned), the high
    plane (int32 words; none: any pointer, never read), scales, k, NVFP4, bits, mult."""
    if len(planes) == 3:
        codes, scale, d_w = planes
        assert codes.shape[1] % 32 == 0, codes.shape  # K % 64
        return codes.view(torch.int32), codes, scale, 2 * codes.shape[1], True, 4, 2.0**22 / d_w
    base, high, scale, bits, group, k = planes
    _spec(bits, group)
    high = high.view(torch.int32) if high.numel() else base
    return base.view(torch.int32), high, scale, k, False, bits, 0.0


def _gemv(x, planes, out, dot, block_n, block_kw, num_warps, num_stages, split):
    words, high, scale, k, nvfp4, bits, mult = _operands(planes)
    (B, _), (N, row_words), lpw = x.shape, words.shape, 4 if bits == 8 else 8
    assert x.shape[1] == k and B <= 16 and words.stride(1) == 1, (x.shape, k)
    x = x.contiguous()
    dot = (B > 2 if dot is None else dot) and row_words % 16 == 0  # tl.dot needs K ≥ 16
    block_kw = math.gcd(row_words, max(block_kw, 16) if dot else block_kw)  # whole tiles
    block_n = (32 if dot else 64) if block_n is None else max(block_n, 16) if dot else block_n
    mult = mult if dot else mult * 2.0**48  # nvfp4 FMA: f = e2m1 * 2^-126, x * 2^64
    n_blocks = triton.cdiv(N, block_n)
    split = split_k(n_blocks, row_words, block_kw) if split is None else split
    assert row_words % (split * block_kw) == 0, (row_words, split, block_kw)
    out = torch.empty(B, N, device=x.device, dtype=x.dtype) if out is None else out
    assert out.shape == (B, N) and out.stride(1) == 1, (out.shape, out.stride())
    y = out if split == 1 else torch.empty(split, B, N, device=x.device, dtype=torch.float32)
    _gemv_kernel[(n_blocks, split)](
        x, words, high, scale, y, B, N, k, x.stride(0), 0 if split == 1 else y.stride(0),
        y.stride(-2), words.stride(0), high.stride(0), scale.stride(0), row_words // split,
        mult, NVFP4=nvfp4, BITS=bits, LPW=lpw, DOT=dot, DOT_T=dot_dtype(),
        BB=16 if dot else triton.next_power_of_2(B), BN=block_n, BKW=block_kw,
        EVEN_K=row_words * lpw == k, MANUAL_RNE=interpreting() and y.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages)
    if split == 2:  # one kernel: fp32 sum, cast into `out`
        return torch.add(y[0], y[1], out=out)
    return out if split == 1 else out.copy_(y.sum(0))


def rowsplit_gemv_triton(x, base, high, scale, bits, group, k, out=None, dot=None,
                         block_n=None, block_kw=16, num_warps=4, num_stages=3, split=None):
    """Triton path. `dot` (default: B > 2) picks the `tl.dot` variant, else register FMA;
    `block_n` defaults to 64 (FMA) / 32 (dot); `block_kw` is in 32-bit code words (8 lanes
    each; Q8: 4); `split` overrides the K split (default: `dequant_gemv_kernels.split_k`)."""
    return _gemv(x, (base, high, scale, bits, group, k), out, dot, block_n, block_kw, num_warps,
                 num_stages, split)


def nvfp4_gemv_triton(x, codes, scale, d_w, out=None, dot=None, block_n=None, block_kw=16,
                      num_warps=4, num_stages=3, split=None):
    """Triton path for nvfp4; the tuning arguments are those of `rowsplit_gemv_triton`."""
    return _gemv(x, (codes, scale, d_w), out, dot, block_n, block_kw, num_warps, num_stages,
                 split)


def rowsplit_gemv(x, base, high, scale, bits, group, k, out=None):
    """`x [B ≤ 16, k] @ Wᵀ → [B, N]` in x's dtype (fp32 accumulation), into `out` if given (a
    `[B, N]` view with unit column stride, e.g. a column slice of a wider buffer)."""
    if use_triton(x):
        return rowsplit_gemv_triton(x, base, high, scale, bits, group, k, out)
    y = (x.float() @ rowsplit_dequant_ref(base, high, scale, bits, group, k).t()).to(x.dtype)
    return y if out is None else out.copy_(y)


def nvfp4_gemv(x, codes, scale, d_w, out=None):
    """The nvfp4 counterpart of `rowsplit_gemv`."""
    if use_triton(x):
        return nvfp4_gemv_triton(x, codes, scale, d_w, out)
    y = (x.float() @ nvfp4_dequant_ref(codes, scale, d_w).t()).to(x.dtype)
    return y if out is None else out.copy_(y)


def _dequant(planes, dtype, block_n, block_kw):
    words, high, scale, k, nvfp4, bits, mult = _operands(planes)
    (N, row_words), block_kw = words.shape, math.gcd(words.shape[1], block_kw)
    y = torch.empty(N, k, device=words.device, dtype=dtype)
    _dequant_kernel[(triton.cdiv(N, block_n), row_words // block_kw)](
        words, high, scale, y, N, k, words.stride(0), high.stride(0), scale.stride(0),
        y.stride(0), mult, NVFP4=nvfp4, BITS=bits, LPW=4 if bits == 8 else 8, BN=block_n,
        BKW=block_kw, MANUAL_RNE=interpreting() and dtype == torch.bfloat16)
    return y


def rowsplit_dequant(base, high, scale, bits, group, k, dtype=torch.bfloat16, kernel=None,
                     block_n=32, block_kw=16):
    """The whole `[N, k]` matrix in `dtype`: the Triton kernel when `kernel` (default: the
    planes are on CUDA), else the reference."""
    if use_triton(base) if kernel is None else kernel:
        return _dequant((base, high, scale, bits, group, k), dtype, block_n, block_kw)
    return rowsplit_dequant_ref(base, high, scale, bits, group, k).to(dtype)


def nvfp4_dequant(codes, scale, d_w, dtype=torch.bfloat16, kernel=None, block_n=32,
                  block_kw=16):
    """The whole `[N, K]` nvfp4 matrix in `dtype`; the arguments are `rowsplit_dequant`'s."""
    if use_triton(codes) if kernel is None else kernel:
        return _dequant((codes, scale, d_w), dtype, block_n, block_kw)
    return nvfp4_dequant_ref(codes, scale, d_w).to(dtype)
