"""The Triton kernels of `kernels.moe_grouped`: a prompt step's routed experts as two grouped
GEMMs over the stacks in their stored form.

`_expert_tile` gives a program its row tile (the expert, the tile's first sorted row, the
expert's row end, and whether the tile is live: the grid launches the most tiles any routing can
need), `_tile_rows` the tile's sorted rows and output columns, `_tile_dot` one K tile's dot of
the stored weights (bf16, or e4m3 codes under row or group scales). `_swiglu_kernel` writes
SiLU(gate)·up of each sorted row (its token gathered from x), `_down_kernel` each row's
weighted down projection, stored in (token, slot) order. `kernels.moe_grouped` plans the tiles,
picks the launch sizes, builds the operands and launches these (the layout and the arithmetic
are described in its docstring).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .moe_fused import _round_bf16


@triton.jit
def _expert_tile(tile_ends_ptr, starts_ptr, counts_ptr, E: tl.constexpr, EP: tl.constexpr,
                 BM: tl.constexpr):
    """(expert, the tile's first sorted row, the expert's row end, live?) of this program's
    row tile (the grid's slow axis: the column tiles of one row tile run side by side)."""
    pid = tl.program_id(1)
    ids = tl.arange(0, EP)
    ends = tl.load(tile_ends_ptr + ids, mask=ids < E, other=2147483647)
    e = tl.sum((ends <= pid).to(tl.int32), axis=0)  # the first expert whose tiles end past pid
    live = e < E
    e = tl.minimum(e, E - 1)
    before = tl.sum(tl.where(ids == e - 1, ends, 0), axis=0)  # tiles of experts < e
    first = tl.load(starts_ptr + e) + (pid - before) * BM
    end = tl.load(starts_ptr + e) + tl.load(counts_ptr + e)
    return e, first, end, live


@triton.jit
def _tile_rows(first, end, n_out, BM: tl.constexpr, BN: tl.constexpr):
    """This program's sorted rows and output columns, with their masks."""
    rows = first + tl.arange(0, BM)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    return rows, rows < end, n, n < n_out


@triton.jit
def _tile_dot(acc, a, w_ptr, s_ptr, e, n, nmask, k0, kk, kmask, N, K, MODE: tl.constexpr,
              G: tl.constexpr, DOT: tl.constexpr):
    """acc + a @ (expert e's rows n, columns kk)ᵀ; with group scales (a K tile inside one
    group) the tile's dot of the exact codes times each row's scale of that group."""
    b = tl.load(w_ptr + e.to(tl.int64) * N * K + n[:, None] * K + kk[None, :],
                mask=nmask[:, None] & kmask[None, :], other=0.0).to(DOT)
    if MODE == 2:
        s = tl.load(s_ptr + (e.to(tl.int64) * N + n) * (K // G) + k0 // G, mask=nmask,
                    other=0.0).to(tl.float32)
        return acc + tl.dot(a, tl.trans(b)) * s[None, :]
    return acc + tl.dot(a, tl.trans(b))


# the model's dims I and H are compile-time: every tile offset is then an immediate off a few
# base registers (as runtime ints each tile element's address took registers: the fp8 SwiGLU
# at 64-row tiles spilled 2,104 bytes a thread, 208 with them; one compile a model's stacks;
# bench/results/sm90-prompt-kernel-resources.md)
@triton.jit
def _swiglu_kernel(x_ptr, xs_ptr, order_ptr, tile_ends_ptr, starts_ptr, counts_ptr, w_ptr,
                   s_ptr, out_ptr, top_k, I: tl.constexpr, H: tl.constexpr, E: tl.constexpr,
                   EP: tl.constexpr,
                   MODE: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, DOT: tl.constexpr, MANUAL_RNE: tl.constexpr,
                   FP8_ACT: tl.constexpr):
    e, first, end, live = _expert_tile(tile_ends_ptr, starts_ptr, counts_ptr, E, EP, BM)
    if live:
        rows, rmask, n, nmask = _tile_rows(first, end, I, BM, BN)
        token = tl.load(order_ptr + rows, mask=rmask, other=0) // top_k
        gate = tl.zeros([BM, BN], tl.float32)
        up = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, H, BK):
            kk = k0 + tl.arange(0, BK)
            kmask = kk < H
            a = tl.load(x_ptr + token.to(tl.int64)[:, None] * H + kk[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0).to(DOT)
            gate = _tile_dot(gate, a, w_ptr, s_ptr, e, n, nmask, k0, kk, kmask, 2 * I, H,
                             MODE, G, DOT)
            up = _tile_dot(up, a, w_ptr, s_ptr, e, n + I, nmask, k0, kk, kmask, 2 * I, H,
                           MODE, G, DOT)
        if FP8_ACT:  # x holds e4m3 codes: each token's scale multiplies its fp32 sums
            x_scale = tl.load(xs_ptr + token, mask=rmask, other=0.0)[:, None]
            gate *= x_scale
            up *= x_scale
        if MODE == 1:
            row_scale = e.to(tl.int64) * 2 * I
            gate *= tl.load(s_ptr + row_scale + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
            up *= tl.load(s_ptr + row_scale + I + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        act = gate / (1.0 + tl.exp(-gate)) * up
        if MANUAL_RNE:
            act = _round_bf16(act)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * I + n[None, :],
                 act.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])


@triton.jit  # H and I compile-time, as the SwiGLU kernel's
def _down_kernel(act_ptr, as_ptr, order_ptr, weights_ptr, tile_ends_ptr, starts_ptr, counts_ptr,
                 w_ptr, s_ptr, out_ptr, H: tl.constexpr, I: tl.constexpr, E: tl.constexpr,
                 EP: tl.constexpr,
                 MODE: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, DOT: tl.constexpr, MANUAL_RNE: tl.constexpr,
                 FP8_ACT: tl.constexpr):
    e, first, end, live = _expert_tile(tile_ends_ptr, starts_ptr, counts_ptr, E, EP, BM)
    if live:
        rows, rmask, n, nmask = _tile_rows(first, end, H, BM, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, I, BK):
            kk = k0 + tl.arange(0, BK)
            kmask = kk < I
            a = tl.load(act_ptr + rows.to(tl.int64)[:, None] * I + kk[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0).to(DOT)
            acc = _tile_dot(acc, a, w_ptr, s_ptr, e, n, nmask, k0, kk, kmask, H, I, MODE, G,
                            DOT)
        if FP8_ACT:
            acc *= tl.load(as_ptr + rows, mask=rmask, other=0.0)[:, None]
        if MODE == 1:
            acc *= tl.load(s_ptr + e.to(tl.int64) * H + n, mask=nmask,
                           other=0.0).to(tl.float32)[None, :]
        slot = tl.load(order_ptr + rows, mask=rmask, other=0)
        weight = tl.load(weights_ptr + slot, mask=rmask, other=0.0).to(tl.float32)
        y = acc * weight[:, None]
        if MANUAL_RNE:
            y = _round_bf16(y)
        tl.store(out_ptr + slot.to(tl.int64)[:, None] * H + n[None, :],
                 y.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])
