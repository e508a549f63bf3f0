"""The Triton side of `kernels.gdn_fused`: its two kernels and the device functions they share.

`_gdn_prep_kernel` (launched by `gdn_fused.gdn_prep_triton`) is the conv state shift, the conv +
SiLU, `g` and `beta` (a width-4 conv's window held in registers across a row's tokens,
`_window4`; other widths through the state in memory, `_window_step`);
`_gdn_gated_norm_kernel` (launched by `gdn_fused.gdn_gated_norm_triton`)
the gated RMSNorm, through `gated_rms` (which `kernels.gdn_split` fuses into its output
launch). `_exp`, `_silu`, `_softplus` and `_round_bf16` are torch's element-wise math in Triton
(libdevice's expf and log1p, IEEE division, fp32 -> bf16 to nearest even; under the interpreter,
which has no extern calls, `tl.exp` and log1p from log); `kernels.gdn_prompt` takes them too.
The launchers, the torch references and the dispatching entry points stay in
`kernels.gdn_fused`.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .pdl import pdl_release, pdl_wait


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    # libdevice's expf is what torch's CUDA kernels call; tl.exp is ex2.approx on GPUs.
    # The interpreter has no extern calls: it takes tl.exp (numpy's exp).
    if LIBDEVICE:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _round_bf16(x):
    # fp32 -> the nearest bf16 (ties to even), kept in fp32. Not `.to(tl.bfloat16)`: the
    # interpreter truncates there (Triton 3.9), and this path is the one the tests check.
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _silu(x, LIBDEVICE: tl.constexpr):
    # torch: x / (1 + exp(-x)), IEEE division
    return tl.math.div_rn(x, 1.0 + _exp(-x, LIBDEVICE))


@triton.jit
def _softplus(x, LIBDEVICE: tl.constexpr):
    # torch (beta 1, threshold 20): x > 20 ? x : log1p(exp(x))
    e = _exp(tl.minimum(x, 20.0), LIBDEVICE)
    if LIBDEVICE:
        lp = libdevice.log1p(e)
    else:  # log1p from log: exact to a few ulps (Goldberg); e < 2^-24 leaves u == 1
        u = 1.0 + e
        lp = tl.where(u == 1.0, e, tl.log(u) * tl.math.div_rn(e, tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _window4(conv_row, w_ptr, c, mask, stride_ct, C, EVEN: tl.constexpr):
    """A width-4 conv's state window (its three taps, the state's dtype) and its four weight
    rows (fp32) at channels `c`."""
    if EVEN:
        s0 = tl.load(conv_row)
        s1 = tl.load(conv_row + stride_ct)
        s2 = tl.load(conv_row + 2 * stride_ct)
        w0 = tl.load(w_ptr + c).to(tl.float32)
        w1 = tl.load(w_ptr + C + c).to(tl.float32)
        w2 = tl.load(w_ptr + 2 * C + c).to(tl.float32)
        w3 = tl.load(w_ptr + 3 * C + c).to(tl.float32)
    else:
        s0 = tl.load(conv_row, mask=mask, other=0.0)
        s1 = tl.load(conv_row + stride_ct, mask=mask, other=0.0)
        s2 = tl.load(conv_row + 2 * stride_ct, mask=mask, other=0.0)
        w0 = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
        w1 = tl.load(w_ptr + C + c, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + 2 * C + c, mask=mask, other=0.0).to(tl.float32)
        w3 = tl.load(w_ptr + 3 * C + c, mask=mask, other=0.0).to(tl.float32)
    return s0, s1, s2, w0, w1, w2, w3


@triton.jit
def _window_step(conv_row, row_ptr, w_ptr, trail_ptr, c, mask, shift, stride_ct, C,
                 K: tl.constexpr, EVEN: tl.constexpr, TRAIL, trail_row):
    """One token of a width-K conv through the state in memory: tap 0 (oldest), then taps
    1..K-1 (the last this token's row at `row_ptr`), each stored back as state row t-1 (where
    `shift`) and, where `TRAIL`, into the trail's rows from `trail_row`; the fp32 sum."""
    if EVEN:
        x = tl.load(conv_row)
        acc = x.to(tl.float32) * tl.load(w_ptr + c).to(tl.float32)
    else:
        x = tl.load(conv_row, mask=mask, other=0.0)
        acc = x.to(tl.float32) * tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    for t in tl.static_range(1, K):
        if t < K - 1:
            src = conv_row + t * stride_ct
        else:
            src = row_ptr
        if EVEN:
            x = tl.load(src)
            w = tl.load(w_ptr + t * C + c).to(tl.float32)
        else:
            x = tl.load(src, mask=mask, other=0.0)
            w = tl.load(w_ptr + t * C + c, mask=mask, other=0.0).to(tl.float32)
        x = x.to(conv_row.dtype.element_ty)
        tl.store(conv_row + (t - 1) * stride_ct, x, mask=shift)
        if TRAIL:  # the window after this token, for a rollback
            tl.store(trail_ptr + (trail_row + t - 1) * C + c, x, mask=mask)
        # the window is the state's dtype (torch.cat of state and row), product and sum fp32
        acc = acc + x.to(tl.float32) * w
    return acc


@triton.jit
def _gdn_prep_kernel(proj_ptr, conv_ptr, idx_ptr, w_ptr, alog_ptr, dtb_ptr, out_ptr, trail_ptr,
                     valid_ptr, N, TRAIL_B, stride_pb, stride_cb, stride_ct,
                     KG: tl.constexpr, VG: tl.constexpr, NV: tl.constexpr, K: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_NV: tl.constexpr, EVEN: tl.constexpr,
                     LIBDEVICE: tl.constexpr, INDEXED: tl.constexpr, T: tl.constexpr,
                     TRAIL: tl.constexpr, VALID: tl.constexpr = 0, PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    b = tl.program_id(0)
    cb = tl.program_id(1)
    WINDOW: tl.constexpr = K == 4  # in registers: 1.07-1.23x the loop (h100-gdn-prep-window)
    C: tl.constexpr = 2 * KG + VG
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = c < C
    if INDEXED:  # the row's state slot
        conv_row = conv_ptr + tl.load(idx_ptr + b).to(tl.int64) * stride_cb + c
    else:
        conv_row = conv_ptr + b * stride_cb + c
    if WINDOW:  # (the models' width) the window in registers across the row's tokens
        s0, s1, s2, w0, w1, w2, w3 = _window4(conv_row, w_ptr, c, mask, stride_ct, C, EVEN)
    # the row's T tokens in order; each shifts the window (the program owns its channels
    # across every tap and token, so the in-place shift has no race); a padding token
    # (`valid`) reads the window without shifting it
    for tok in range(T):  # a loop: a 64-token prompt row unrolled compiled for minutes
        shift = mask
        if VALID:
            # (c < C) for a real token, nothing for a padding one
            shift = c < tl.where(tl.load(valid_ptr + b) > tok, C, 0)
        bt = b * T + tok  # token row
        if WINDOW:  # no store and load back through memory a token, as the loop below
            src = proj_ptr + bt * stride_pb + c  # this token's q|k|v row
            if EVEN:
                x = tl.load(src)
            else:
                x = tl.load(src, mask=mask, other=0.0)
            x = x.to(conv_ptr.dtype.element_ty)
            acc = s0.to(tl.float32) * w0
            acc = acc + s1.to(tl.float32) * w1
            acc = acc + s2.to(tl.float32) * w2
            acc = acc + x.to(tl.float32) * w3
            if TRAIL and tok < T - 1:  # the window after this token, for a rollback
                at = trail_ptr + (tok * TRAIL_B + b) * (K - 1) * C + c
                tl.store(at, s1, mask=mask)
                tl.store(at + C, s2, mask=mask)
                tl.store(at + 2 * C, x, mask=mask)
            s0 = tl.where(shift, s1, s0)
            s1 = tl.where(shift, s2, s1)
            s2 = tl.where(shift, x, s2)
        else:
            acc = _window_step(conv_row, proj_ptr + bt * stride_pb + c, w_ptr, trail_ptr, c,
                               mask, shift, stride_ct, C, K, EVEN, TRAIL and tok < T - 1,
                               (tok * TRAIL_B + b) * (K - 1))
        y = _silu(acc, LIBDEVICE)
        # out = q [N, KG] | k [N, KG] | v [N, VG] | g [N, NV] | beta [N, NV], fp32
        off = tl.where(c < KG, bt * KG + c,
                       tl.where(c < 2 * KG, N * KG + bt * KG + (c - KG),
                                2 * N * KG + bt * VG + (c - 2 * KG)))
        if EVEN:
            tl.store(out_ptr + off, y)
        else:
            tl.store(out_ptr + off, y, mask=mask)
        if cb == 0:
            j = tl.arange(0, BLOCK_NV)
            jm = j < NV
            row = proj_ptr + bt * stride_pb + C + VG  # b, then a
            bb = tl.load(row + j, mask=jm, other=0.0).to(tl.float32)
            a = tl.load(row + NV + j, mask=jm, other=0.0).to(tl.float32)
            a = a + tl.load(dtb_ptr + j, mask=jm, other=0.0)
            g = -_exp(tl.load(alog_ptr + j, mask=jm, other=0.0), LIBDEVICE) * _softplus(
                a, LIBDEVICE)
            beta = tl.math.div_rn(1.0, 1.0 + _exp(-bb, LIBDEVICE))
            base = out_ptr + N * C + bt * NV + j
            tl.store(base, g, mask=jm)
            tl.store(base + N * NV, beta, mask=jm)
    if WINDOW:
        tl.store(conv_row, s0, mask=mask)
        tl.store(conv_row + stride_ct, s1, mask=mask)
        tl.store(conv_row + 2 * stride_ct, s2, mask=mask)


# one variant for every row count: a decode graph's and a prompt step's
@triton.jit(do_not_specialize=["n_rows"])
def _gdn_gated_norm_kernel(o_ptr, z_ptr, w_ptr, out_ptr, at_ptr, n_rows, stride_zb, eps,
                           NV: tl.constexpr, DV: tl.constexpr, BLOCK: tl.constexpr,
                           ROWS: tl.constexpr, GATHER: tl.constexpr,
                           ROUND_PROD: tl.constexpr, LIBDEVICE: tl.constexpr,
                           PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # b * NV + j
    b = row // NV
    j = row % NV
    d = tl.arange(0, BLOCK)
    m = (row < n_rows)[:, None] & (d < DV)[None, :]
    if GATHER:  # o row b is o[at[b]] (a prompt step's chunk-padded layout)
        src = tl.load(at_ptr + b, mask=row < n_rows, other=0)
    else:
        src = b
    o = tl.load(o_ptr + (src * NV + j)[:, None] * DV + d[None, :], mask=m,
                other=0.0).to(tl.float32)
    w = tl.load(w_ptr + d, mask=d < DV, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + b[:, None] * stride_zb + (j * DV)[:, None] + d[None, :], mask=m,
                other=0.0).to(tl.float32)
    tl.store(out_ptr + row[:, None] * DV + d[None, :],
             gated_rms(o, w, z, eps, DV, ROUND_PROD, LIBDEVICE).to(tl.bfloat16), mask=m)


@triton.jit
def gated_rms(o, w, z, eps, DV: tl.constexpr, ROUND_PROD: tl.constexpr,
              LIBDEVICE: tl.constexpr):
    """`norm · rmsnorm(o) · silu(z)` of rows o [R, BLOCK] fp32 (columns past DV zero), the
    weight w [BLOCK] and the gate z [R, BLOCK] as fp32, rounded where the reference rounds;
    the bf16 values as fp32."""
    o = _round_bf16(o)
    o = o * tl.rsqrt(tl.sum(o * o, axis=1) / DV + eps)[:, None]
    # norm · o.to(bf16): a bf16 weight gives a bf16 product (ROUND_PROD), fp32 stays fp32
    p = w[None, :] * _round_bf16(o)
    if ROUND_PROD:  # exact in fp32 (8-bit × 8-bit significands), then one bf16 rounding
        p = _round_bf16(p)
    return _round_bf16(p * _silu(z, LIBDEVICE))
