"""Batch-1..16 matmul `y = x Wᵀ` over the artifact's packed weights, dequantised in the loads.

The weights are the planes of `artifact.planes` (ninfer-format.md §2.1, §2.2): row-split
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
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..artifact import blockscale, rowsplit
from ._dispatch import dot_dtype, interpreting, use_triton
from .dequant_gemv import split_k
from .moe_fused import _round_bf16


def _spec(bits, group):
    spec = {4: "q4_g64_fp16", 5: "q5_g64_fp16", 6: "q6_g64_fp16", 8: "q8_g32_fp16"}[bits]
    assert rowsplit.FORMATS[spec].group == group, (bits, group)
    return rowsplit.FORMATS[spec]


# --------------------------------------------------------------------------------------------
# torch references (the planes come from `artifact.planes`)

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


@triton.jit
def _load_words(base_row, high_row, scale_row, words, mult, NVFP4: tl.constexpr,
                BITS: tl.constexpr):
    """Code words `[BN, BKW]` (sign bits flipped), their high bits, and each word's group factors
    `mul`, `add` (weight = f(lane) * mul + add)."""
    wd = tl.load(base_row + words[None, :]).to(tl.uint32, bitcast=True)
    hw = wd  # no high plane
    if NVFP4:  # E4M3 via fp16 bits (worth 2^-8 of it); mult = 2^22 / d_w; 2 words per group
        sb = tl.load(scale_row + (words // 2)[None, :]).to(tl.uint32)
        sb = ((sb & 0x7F) << 7).to(tl.uint16)
        mul = sb.to(tl.float16, bitcast=True).to(tl.float32) * mult
    else:  # 8 words per group
        mul = tl.load(scale_row + (words // 8)[None, :]).to(tl.float32) * (1 << BITS)
        if BITS == 4:
            wd = wd ^ 0x88888888
        if BITS == 8:
            wd = wd ^ 0x80808080
        # the high plane as int32 (a byte-wide tile would set the layout: 16 words per thread)
        if BITS == 5:  # one high byte per word: lane t = bit t, the sign bit of the 5-bit code
            hw = tl.load(high_row + (words // 4)[None, :]).to(tl.uint32, bitcast=True)
            hw = (hw >> (8 * (words % 4))[None, :]) ^ 0xFF
        if BITS == 6:  # 16 high bits per word: lane t = bits 2t, 2t+1
            hw = tl.load(high_row + (words // 2)[None, :]).to(tl.uint32, bitcast=True)
            hw = (hw >> (16 * (words % 2))[None, :]) ^ 0xAAAA
    return wd, hw, mul, mul * -1.5  # `add` (unused by nvfp4)


@triton.jit
def _lane(wd, hw, t, NVFP4: tl.constexpr, BITS: tl.constexpr):
    """Lane(s) `t` (a constant, or a tensor broadcasting against `wd`) as fp32 `f`; the weight is
    `f * mul + add` (nvfp4: `f * mul`)."""
    if NVFP4:  # E2M1 as fp16 bits worth 2^-14 of it: sign to bit 15, exponent, mantissa to 11..9
        v = wd >> (4 * t)
        h = ((v & 8) << 12) | ((v & 7) << 9)
        f = h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        if BITS == 8:
            v = (wd >> (8 * t)) & 0xFF
        else:
            v = (wd >> (4 * t)) & 0xF
            if BITS == 5:
                v = v | (((hw >> t) & 1) << 4)
            if BITS == 6:
                v = v | (((hw >> (2 * t)) & 3) << 4)
        f = ((v << (23 - BITS)) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + v / 2^b
    return f


@triton.jit
def _shl(x, S: tl.constexpr):
    if S >= 0:
        r = x << S
    else:
        r = x >> (-S)
    return r


@triton.jit
def _lane_c(wd, hw, T: tl.constexpr, NVFP4: tl.constexpr, BITS: tl.constexpr):
    """`_lane` for a constant lane: each field shifted straight to its place (shift + lop3).
    nvfp4: the E2M1 bits become fp32 sign, exponent and mantissa bits: `f = e2m1 * 2^-126`
    (subnormal for |e2m1| < 1; exact, GPUs keep fp32 subnormals without ftz), the caller scales
    x by 2^64 and `mul` by 2^48 more so that products stay normal."""
    if NVFP4:
        bits = (_shl(wd, 28 - 4 * T) & 0x80000000) | (_shl(wd, 22 - 4 * T) & (7 << 22))
        f = bits.to(tl.float32, bitcast=True)
    else:
        LB: tl.constexpr = 8 if BITS == 8 else 4
        bits = (_shl(wd, 23 - BITS - LB * T) & (((1 << LB) - 1) << (23 - BITS))) | 0x3F800000
        if BITS == 5:
            bits = bits | (_shl(hw, 22 - T) & (1 << 22))
        if BITS == 6:
            bits = bits | (_shl(hw, 21 - 2 * T) & (3 << 21))
        f = bits.to(tl.float32, bitcast=True)
    return f


@triton.jit
def _gemv_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, y_ptr, B, N, K, stride_xb,
                 stride_ys, stride_yb, stride_base, stride_high, stride_scale, words_per_split,
                 mult, NVFP4: tl.constexpr, BITS: tl.constexpr, LPW: tl.constexpr,
                 DOT: tl.constexpr, DOT_T: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr,
                 BKW: tl.constexpr, EVEN_K: tl.constexpr, MANUAL_RNE: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    r64 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]  # clamped: loads need no row mask
    c = tl.arange(0, BKW)
    bat = tl.arange(0, BB)
    if DOT:
        acc = tl.zeros([BB, BN], tl.float32)
    elif BB == 1:
        acc = tl.zeros([BN, BKW], tl.float32)
    else:
        acc = tl.zeros([BB, BN, BKW], tl.float32)
    w0 = tl.program_id(1) * words_per_split
    for kw in range(w0, w0 + words_per_split, BKW):
        words = kw + c
        wd, hw, mul, add = _load_words(base_ptr + r64 * stride_base, high_ptr + r64 * stride_high,
                                       scale_ptr + r64 * stride_scale, words, mult, NVFP4, BITS)
        # FMA: per word, part = Σ_t f_t x_t and xs = Σ_t x_t, then acc += part * mul + xs * add
        part = tl.zeros(acc.shape, tl.float32)
        xs = tl.zeros([BB, BKW], tl.float32)
        for t in tl.static_range(LPW):  # one lane of every word: 2-D tiles only
            if DOT:  # the weight itself must be normal: nvfp4 through fp16 bits
                f = _lane(wd, hw, t, NVFP4, BITS)
            else:
                f = _lane_c(wd, hw, t, NVFP4, BITS)  # [BN, BKW]
            cols = words * LPW + t
            kmask = (cols < K) | EVEN_K
            if BB == 1 and not DOT:
                x = tl.load(x_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
                if NVFP4:
                    x = x * 18446744073709551616.0  # 2^64
                part += f * x[None, :]
                xs += x[None, :]
            else:
                x = tl.load(x_ptr + bat[:, None] * stride_xb + cols[None, :],
                            mask=(bat < B)[:, None] & kmask[None, :], other=0.0)
                if DOT:
                    w = f * mul if NVFP4 else f * mul + add
                    acc += tl.dot(x.to(DOT_T), tl.trans(w.to(DOT_T)))
                else:
                    x = x.to(tl.float32)
                    if NVFP4:
                        x = x * 18446744073709551616.0  # 2^64
                    part += x[:, None, :] * f[None, :, :]
                    xs += x
        if not DOT:
            if BB == 1:
                acc += part * mul if NVFP4 else part * mul + xs * add
            else:
                acc += part * mul[None] if NVFP4 else part * mul[None] + xs[:, None] * add[None]
    if not DOT:
        acc = tl.sum(acc, 1)[None, :] if BB == 1 else tl.sum(acc, 2)
    if MANUAL_RNE:
        acc = _round_bf16(acc)
    out = y_ptr + tl.program_id(1) * stride_ys + bat[:, None] * stride_yb + rows[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(bat < B)[:, None] & (rows < N)[None, :])


@triton.jit
def _dequant_kernel(base_ptr, high_ptr, scale_ptr, y_ptr, N, K, stride_base, stride_high,
                    stride_scale, stride_y, mult, NVFP4: tl.constexpr, BITS: tl.constexpr,
                    LPW: tl.constexpr, BN: tl.constexpr, BKW: tl.constexpr,
                    MANUAL_RNE: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    r64 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]
    words = tl.program_id(1) * BKW + tl.arange(0, BKW)
    wd, hw, mul, add = _load_words(base_ptr + r64 * stride_base, high_ptr + r64 * stride_high,
                                   scale_ptr + r64 * stride_scale, words, mult, NVFP4, BITS)
    t = tl.arange(0, LPW)[None, None, :]  # [BN, BKW, LPW]: rows stored contiguously
    w = _lane(wd[:, :, None], hw[:, :, None], t, NVFP4, BITS) * mul[:, :, None]
    if not NVFP4:
        w += add[:, :, None]
    if MANUAL_RNE:
        w = _round_bf16(w)
    cols = words[:, None] * LPW + tl.arange(0, LPW)[None, :]
    tl.store(y_ptr + r64[:, :, None] * stride_y + cols[None, :, :], w.to(y_ptr.dtype.element_ty),
             mask=(rows < N)[:, None, None] & (cols < K)[None, :, :])


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
    each; Q8: 4); `split` overrides the K split (default: `dequant_gemv.split_k`)."""
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
