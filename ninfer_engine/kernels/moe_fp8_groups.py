"""The fused expert decode kernels of `moe_fused` over group-scaled e4m3 stacks.

Stacks: codes `[E, N, K]` float8_e4m3fn with one scale per G consecutive columns,
`scale [E, N, K // G]` (G a power of two; the exact e4m3 form of Q4/Q5 g64 groups,
`models.experts`). Same semantics, grids and rounding as `moe_gate_up_silu_triton` /
`moe_down_combine_triton` (which call these when given 3-D scales): fp32 accumulation, one
cast at the end.

Each weight tile is loaded as `[rows, BK // G, G]`, so a group's scale is one `[rows, BK // G]`
load broadcast over its G columns. A per-element gather of the scales in 2-D tiles (the
first version) ran the gate|up kernel at 0.5 TB/s on the H200 (Flash-Next shapes, B = 1:
41.9 µs); the 3-D tiles at 2.2 TB/s (9.7 µs; fp8-row 7.3, bf16 11.7). Register (FMA)
formulation only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .moe_fused import _round_bf16  # moe_fused/moe_down import this module only in wrappers


@triton.jit
def _gate_up_silu_groups_kernel(x_ptr, w_ptr, ids_ptr, y_ptr, s_ptr, I, H, rep, NG,
                                BI: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
                                EVEN_K: tl.constexpr, MANUAL_RNE: tl.constexpr):
    s = tl.program_id(0)
    ib = tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    cols = ib * BI + tl.arange(0, BI)
    cmask = cols < I
    grp = tl.arange(0, BK // G)
    kk = grp[:, None] * G + tl.arange(0, G)[None, :]  # [BK/G, G]: a tile's columns
    offs = cols[:, None, None] * H + kk[None, :, :]
    soffs = cols[:, None] * NG + grp[None, :]  # [BI, BK/G]
    x_row = x_ptr + (s // rep).to(tl.int64) * H
    g_base = w_ptr + e * 2 * I * H
    u_base = g_base + I * H
    gs_base = s_ptr + e * 2 * I * NG
    us_base = gs_base + I * NG
    acc_g = tl.zeros([BI, BK // G, G], tl.float32)
    acc_u = tl.zeros([BI, BK // G, G], tl.float32)
    for k in range(0, H, BK):
        wmask = cmask[:, None, None]
        smask = cmask[:, None]
        if not EVEN_K:  # an H tail (tiny test shapes): whole groups, H % G == 0
            wmask = wmask & (k + kk < H)[None, :, :]
            smask = smask & (k + grp * G < H)[None, :]
        sg = tl.load(gs_base + k // G + soffs, mask=smask, other=0.0).to(tl.float32)
        su = tl.load(us_base + k // G + soffs, mask=smask, other=0.0).to(tl.float32)
        # no fill for e4m3 codes (see moe_fused); a masked tail is zeroed after the cast
        g = tl.load(g_base + k + offs, mask=wmask).to(tl.float32) * sg[:, :, None]
        u = tl.load(u_base + k + offs, mask=wmask).to(tl.float32) * su[:, :, None]
        if EVEN_K:
            xv = tl.load(x_row + k + kk)
        else:
            g = tl.where(wmask, g, 0.0)
            u = tl.where(wmask, u, 0.0)
            xv = tl.load(x_row + k + kk, mask=k + kk < H, other=0.0)
        xv = xv.to(tl.float32)[None, :, :]
        acc_g += g * xv
        acc_u += u * xv
    gs = tl.sum(tl.sum(acc_g, axis=2), axis=1)
    us = tl.sum(tl.sum(acc_u, axis=2), axis=1)
    act = gs / (1.0 + tl.exp(-gs)) * us
    if MANUAL_RNE:
        act = _round_bf16(act)
    tl.store(y_ptr + s * I + cols, act.to(y_ptr.dtype.element_ty), mask=cmask)


def gate_up_silu_groups(x, w_gu, ids, scale, y, block_i, block_k, num_warps, manual_rne):
    """`moe_gate_up_silu_triton` over group-scaled codes, into `y [S, I]`."""
    E, I2, H = w_gu.shape
    I, S, NG = I2 // 2, ids.shape[0], scale.shape[2]
    G = H // NG
    block_k = max(G, min(block_k, triton.next_power_of_2(H)))  # whole groups in a tile
    _gate_up_silu_groups_kernel[(S, triton.cdiv(I, block_i))](
        x, w_gu, ids, y, scale, I, H, S // x.shape[0], NG, BI=block_i, BK=block_k, G=G,
        EVEN_K=H % block_k == 0, MANUAL_RNE=manual_rne, num_warps=num_warps)
    return y


@triton.jit
def _down_combine_groups_kernel(a_ptr, w_ptr, ids_ptr, wt_ptr, y_ptr, s_ptr, H, I, NG,
                                KS: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                                G: tl.constexpr, EVEN_K: tl.constexpr,
                                MANUAL_RNE: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    rows = hb * BH + tl.arange(0, BH)
    hmask = rows < H
    grp = tl.arange(0, BK // G)
    kk = grp[:, None] * G + tl.arange(0, G)[None, :]  # [BK/G, G]
    offs = rows[:, None, None] * I + kk[None, :, :]
    soffs = rows[:, None] * NG + grp[None, :]
    acc = tl.zeros([BH, BK // G, G], tl.float32)
    for j in tl.static_range(KS):  # unrolled, as in moe_fused
        s = b * KS + j
        e = tl.load(ids_ptr + s).to(tl.int64)
        wt = tl.load(wt_ptr + s).to(tl.float32)
        a_row = a_ptr + s.to(tl.int64) * I
        w_base = w_ptr + e * H * I
        s_base = s_ptr + e * H * NG
        for k in range(0, I, BK):
            wmask = hmask[:, None, None]
            smask = hmask[:, None]
            if not EVEN_K:
                wmask = wmask & (k + kk < I)[None, :, :]
                smask = smask & (k + grp * G < I)[None, :]
            sc = tl.load(s_base + k // G + soffs, mask=smask, other=0.0).to(tl.float32)
            w = tl.load(w_base + k + offs, mask=wmask).to(tl.float32) * sc[:, :, None]
            if EVEN_K:
                av = tl.load(a_row + k + kk)
            else:
                w = tl.where(wmask, w, 0.0)
                av = tl.load(a_row + k + kk, mask=k + kk < I, other=0.0)
            acc += w * (av.to(tl.float32) * wt)[None, :, :]
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    if MANUAL_RNE:
        out = _round_bf16(out)
    tl.store(y_ptr + b * H + rows, out.to(y_ptr.dtype.element_ty), mask=hmask)


def down_combine_groups(act, w_down, ids, weights, scale, y, B, k, block_h, block_k,
                        num_warps, manual_rne):
    """`moe_down_combine_triton` over group-scaled codes, into `y [B, H]`."""
    E, H, I = w_down.shape
    NG = scale.shape[2]
    G = I // NG
    block_k = max(G, min(block_k, triton.next_power_of_2(I)))
    _down_combine_groups_kernel[(B, triton.cdiv(H, block_h))](
        act, w_down, ids, weights, y, scale, H, I, NG, k, BH=block_h, BK=block_k, G=G,
        EVEN_K=I % block_k == 0, MANUAL_RNE=manual_rne, num_warps=num_warps)
    return y

