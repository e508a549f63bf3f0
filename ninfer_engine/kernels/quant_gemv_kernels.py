"""The Triton kernels of `kernels.quant_gemv`: packed code words decoded in registers.

`_load_words` loads a `[BN rows, BKW words]` tile of a plane tuple's 32-bit code words, their
high bits and each word's group factors; `_lane` and `_lane_c` (a constant lane, each field
shifted straight into place by `_shl`) turn one lane of every word into fp32 without int→float
conversions (the arithmetic is described in `kernels.quant_gemv`'s docstring). `_gemv_kernel`
is the batch-1..16 GEMV over them (register FMA or `tl.dot`, K optionally split across
programs) and `_dequant_kernel` writes the whole matrix; `kernels.quant_gemv` builds their
operands, launches them, and holds the torch references and the dispatching entry points.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .moe_fused import _round_bf16


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
