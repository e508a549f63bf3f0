"""Fused routed-expert decode: routing, gate|up + SwiGLU, down + weighted slot sum.

Three launches replace the ~10 small ones of the torch sequence in `HybridStep._moe`:
`route_topk` (routing, `kernels.moe_route`, re-exported here) and the two below.

`moe_gate_up_silu(x, w_gu, ids, scale=None)`
    w_gu `[E, 2I, H]` bf16 (gate rows 0..I-1, up rows I..2I-1 of each expert), ids `[S]` →
    act `[S, I]` bf16 = SiLU(x·gateᵀ) · (x·upᵀ). x is `[S, H]` (one row per slot), `[1, H]`
    (shared by every slot) or `[R, H]` with R dividing S (row s // (S/R), i.e. `[B, H]` for
    S = B·k slots laid out token-major: no expand/reshape copy of the token rows needed).
    Rounding: both dot products are accumulated in fp32 and SiLU(g)·u is taken in fp32, then
    cast once. The torch sequence `g, u = moe_gemv(x, w_gu, ids).chunk(2, -1); F.silu(g) * u`
    rounds g and u to bf16, then SiLU(g) to bf16, then the product: ~3 bf16 roundings
    (≈ 2⁻⁹ relative each) instead of one, so the two agree only to bf16 tolerance (~1e-2).

`moe_down_combine(act, w_down, ids, weights, B, k, scale=None)`
    act `[B·k, I]` bf16, w_down `[E, H, I]` bf16, ids `[B·k]`, weights `[B, k]` fp32 → out
    `[B, H]` bf16 = Σ_slot weights[b, slot] · (act[b·k + slot] · w_down[ids[b·k + slot]]ᵀ).
    Rounding: everything in fp32, one cast. The torch sequence
    `(moe_gemv(act, w_down, ids).view(B, k, -1) * weights.to(bf16)[..., None]).float().sum(1)`
    rounds each slot's down output to bf16, the weights to bf16 and their product to bf16
    before the fp32 slot sum: again agreement to bf16 tolerance only. One program per (row,
    block of H outputs) loops over the k slots: no atomics, deterministic.
    `moe_down_combine_triton(..., slot_split=S, k_split=K, out=None)`: S > 1 slot groups (K > 1
    chunks of I) per (row, block of H), each program `tl.atomic_add`-ing its fp32 partial sums
    into a zeroed fp32 [B, H] buffer: S·K times the programs, fewer dependent loads each, for
    B = 1 where the plain grid (256 programs of 8 rows at H = 2048) is latency-bound. `out`
    (a caller's zeroed fp32 buffer, also without a split) is summed into and returned as is:
    fp32, never rounded to bf16 in the kernel; the engine can zero every layer's buffer in one
    launch a step, and its RMSNorm reads fp32. Without `out` a split returns the fp32 sums
    cast once to act's dtype. With more than two partials a row the atomics' order, so the
    last fp32 bits, vary from run to run. S = K = 1 without `out` is the kernel above, bit for
    bit (the same PTX for sm_90).

All ids stay on the device (no host sync), so a decode step remains graph-capturable.

fp8 experts (`scale` given; `models.experts` decides which experts are served so): the stacks
hold e4m3 codes with one fp32/bf16/fp16 scale a row (`[E, 2I]` / `[E, H]`, fp8-row) or a
G-column group (`[E, 2I, H // G]` / `[E, H, I // G]`, the exact form of Q4/Q5 groups; those
run the 3-D-tile kernels of `moe_fp8_groups`, no `use_dot`). Codes are cast to fp32 in the
load. Row scales multiply the gate|up kernel's reduced sums, once per output (nothing in its
loop), and the down kernel's tile (one multiply an element: its accumulator sums slots of
different experts; the `tl.dot` variant scales each slot's sums instead). `ROW_SCALE` is a
compile-time switch: the bf16 kernels (scale None) are unchanged. H200, Flash-Next shapes,
B = 1 / 8, default tiles (bench/moe_fp8_bench.py --quick, 2026-11-30): gate|up fp8-row 7.3 /
51.6 µs, fp8 groups 9.7 / 62.2, bf16 11.7 / 79.1; down fp8-row 8.1 / 37.2, groups 7.7 / 42.5,
bf16 6.2 / 44.3. Half the bytes, but the fp8 → fp32 casts and the scale multiplies cost issue
slots: the down kernel at B = 1 is slower than bf16 (tiles not yet swept for fp8).

GEMV formulation (`use_dot`, default False; `bench/moe_fused_sweep.py` times both over block
sizes on a GPU: on the H200 the default reached 3.3 TB/s, the `tl.dot` variant 1.6): a decode
slot is one activation row against a [BLOCK, K] tile of its own expert, so the kernels are bound
by weight bytes, not FLOPs (35B-A3B, B = 1: 8 × 4 MiB of gate|up for 16 M FMAs). The default
multiplies in registers into a 2-D fp32 [BLOCK, BK] accumulator reduced once at the end: 16-byte
vector loads straight into registers, no shared-memory staging, no wasted MMA rows; its latency
hiding comes from large tiles (gate|up: 2 × [16, 512] bf16 = 32 KiB of loads per iteration, 8
warps) and, in the down kernel, from the k slots being unrolled (their tiles are independent
loads). `use_dot=True` pads the row to the 16 rows `tl.dot` needs, like `moe_gemv`: 15/16 of the
MMA work is zeros, but with the runtime's divisibility hints Triton software-pipelines that loop
(cp.async, num_stages buffers in shared memory), which the FMA loop does not get. sm_90 ptxas
(compiled offline with the hints the runtime gives H = 2048, I = 512): gate|up FMA 16×512/8 warps
128 registers, dot 16×256/4 warps 72 registers + 48 KiB shared; down FMA 8×512/4 warps 95
registers, dot 16×512/4 warps 80 registers + 64 KiB shared; no spills.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, interpreting, use_triton
from .moe_dequant import dequantize_experts, scale_layout
from .moe_route import route_topk, route_topk_ref, route_topk_triton  # noqa: F401 (re-exported)


@triton.jit
def _round_bf16(x):
    """fp32 → bf16 rounded to nearest even, by hand. On GPUs `.to(bf16)` does that (cvt.rn);
    the interpreter (Triton 3.9) truncates, so there the kernels round with this, to be tested
    against a once-rounded fp32 reference. Finite values only (NaN payloads are not kept)."""
    u = x.to(tl.uint32, bitcast=True)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


def _manual_rne(dtype):
    return interpreting() and dtype == torch.bfloat16


def _stages(num_stages):
    return {} if num_stages is None else {"num_stages": num_stages}

# --------------------------------------------------------------------------------------------
# moe_gate_up_silu


def moe_gate_up_silu_ref(x, w_gu, ids, scale=None):
    """Torch reference in fp32 (what the fused kernel computes), cast once to x's dtype."""
    S = ids.shape[0]
    xs = x.float().repeat_interleave(S // x.shape[0], 0)
    gu = torch.einsum("sk,snk->sn", xs, dequantize_experts(w_gu, scale, ids))
    g, u = gu.chunk(2, -1)
    return (torch.nn.functional.silu(g) * u).to(x.dtype)


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, ids_ptr, y_ptr, s_ptr, I, H, rep,
                         USE_DOT: tl.constexpr, DOT: tl.constexpr, BI: tl.constexpr,
                         BK: tl.constexpr, EVEN_K: tl.constexpr, MANUAL_RNE: tl.constexpr,
                         ROW_SCALE: tl.constexpr):
    s = tl.program_id(0)
    ib = tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    cols = ib * BI + tl.arange(0, BI)
    cmask = cols < I
    kk = tl.arange(0, BK)
    x_row = x_ptr + (s // rep).to(tl.int64) * H
    # scalar int64 bases and one int32 offset tile shared by gate and up (a tile of 64-bit
    # pointers would cost two registers per element)
    g_base = w_ptr + e * 2 * I * H
    u_base = g_base + I * H
    offs = cols[:, None] * H + kk[None, :]  # [BI, BK]
    if USE_DOT:
        one = tl.arange(0, 16)
        acc_g = tl.zeros([16, BI], tl.float32)
        acc_u = tl.zeros([16, BI], tl.float32)
    else:
        acc_g = tl.zeros([BI, BK], tl.float32)
        acc_u = tl.zeros([BI, BK], tl.float32)
    for k in range(0, H, BK):
        wmask = cmask[:, None]
        if not EVEN_K:  # an H tail (tiny test shapes)
            wmask = wmask & (k + kk < H)[None, :]
        if not ROW_SCALE:
            g = tl.load(g_base + k + offs, mask=wmask, other=0.0)
            u = tl.load(u_base + k + offs, mask=wmask, other=0.0)
        else:
            # e4m3 codes: no fill value (an fp8 `other` does not lower everywhere); a masked
            # tail is zeroed after the cast instead (a stray NaN code times a zero x is NaN)
            g = tl.load(g_base + k + offs, mask=wmask).to(tl.float32)
            u = tl.load(u_base + k + offs, mask=wmask).to(tl.float32)
            if not EVEN_K:
                g = tl.where(wmask, g, 0.0)
                u = tl.where(wmask, u, 0.0)
        if USE_DOT:
            # one activation row padded to the 16 rows tl.dot needs
            xmask = (one == 0)[:, None]
            if not EVEN_K:
                xmask = xmask & (k + kk < H)[None, :]
            xt = tl.load(x_row + (k + kk)[None, :] + one[:, None] * 0, mask=xmask, other=0.0)
            xt = xt.to(DOT)
            acc_g += tl.dot(xt, tl.trans(g.to(DOT)))
            acc_u += tl.dot(xt, tl.trans(u.to(DOT)))
        else:
            if EVEN_K:
                xv = tl.load(x_row + k + kk)
            else:
                xv = tl.load(x_row + k + kk, mask=k + kk < H, other=0.0)
            xv = xv.to(tl.float32)[None, :]
            acc_g += g.to(tl.float32) * xv
            acc_u += u.to(tl.float32) * xv
    if USE_DOT:
        gs = tl.sum(acc_g, axis=0)  # rows 1..15 are zero
        us = tl.sum(acc_u, axis=0)
    else:
        gs = tl.sum(acc_g, axis=1)
        us = tl.sum(acc_u, axis=1)
    if ROW_SCALE:  # once per output, after the reduction: nothing in the loop
        s_row = s_ptr + e * 2 * I
        gs = gs * tl.load(s_row + cols, mask=cmask, other=0.0).to(tl.float32)
        us = us * tl.load(s_row + I + cols, mask=cmask, other=0.0).to(tl.float32)
    act = gs / (1.0 + tl.exp(-gs)) * us
    if MANUAL_RNE:
        act = _round_bf16(act)
    tl.store(y_ptr + s * I + cols, act.to(y_ptr.dtype.element_ty), mask=cmask)


# Register-kernel tiles (block, block_k, num_warps) by (scale mode, one row?), from the H200
# sweep in which every call reads another layer's experts as decode does
# (bench/results/h200-moe-slots.md: 1.05-1.5x the previous 16/512/8 and 8/512/4 tiles). Group
# scales (mode 2) were not swept and keep those.
GATE_UP_TILES = {(0, True): (16, 256, 8), (0, False): (16, 256, 8), (1, True): (16, 256, 8),
                 (1, False): (16, 256, 4), (2, True): (16, 512, 8), (2, False): (16, 512, 8)}
DOWN_TILES = {(0, True): (8, 512, 8), (0, False): (8, 256, 4), (1, True): (8, 512, 8),
              (1, False): (8, 512, 2), (2, True): (8, 512, 4), (2, False): (8, 512, 4)}


def down_split_launch(B, k, w_down, scale):
    """The split the decode step gives the down + combine kernel with its fp32 `out` (H200,
    bench/results/h200-moe-down-split.md): one row takes every slot as its own program group
    and I in two chunks, 35B-A3B bf16 9.1 -> 6.9 µs, Flash-Next fp8-row 13.7 -> 6.3; several
    rows and group-scaled experts keep one program per (row, block of H)."""
    mode = scale_layout(w_down, scale)[0]
    if B != 1 or mode == 2:
        return {}
    block_k = 256
    return dict(slot_split=k, k_split=2 if w_down.shape[2] >= 2 * block_k else 1,
                block_h=16 if mode == 0 else 32, block_k=block_k, num_warps=4)


def _tile(table, mode, rows, block, block_k, num_warps):
    """The caller's tile where given, else the table's for this scale mode and row count."""
    tb, tk, tw = table[mode, rows == 1]
    return (tb if block is None else block, tk if block_k is None else block_k,
            tw if num_warps is None else num_warps)


def moe_gate_up_silu_triton(x, w_gu, ids, block_i=None, block_k=None, use_dot=False,
                            num_warps=None, num_stages=None, scale=None):
    """Triton path: one program per (slot, block of I output columns): with I = 512 and
    block_i = 16, 32 per slot, 288 at B = 1 with 8 routed slots and the shared one (~2 per
    H200 SM). Tiles default to `GATE_UP_TILES`. `scale`: see `moe_dequant.scale_layout` (None:
    bf16 weights, the unchanged kernel)."""
    E, I2, H = w_gu.shape
    I, S = I2 // 2, ids.shape[0]
    assert x.shape[-1] == H and S % x.shape[0] == 0, (x.shape, w_gu.shape, S)
    mode = scale_layout(w_gu, scale)[0]
    block_i, block_k, num_warps = _tile(GATE_UP_TILES, mode, x.shape[0], block_i, block_k,
                                        num_warps)
    block_k = min(block_k, max(16, triton.next_power_of_2(H)))
    y = torch.empty(S, I, device=x.device, dtype=x.dtype)
    x = x.contiguous()
    if mode == 2:  # group scales: their own kernel (register formulation only)
        from .moe_fp8_groups import gate_up_silu_groups
        return gate_up_silu_groups(x, w_gu, ids, scale, y, block_i, block_k, num_warps,
                                   _manual_rne(y.dtype))
    _gate_up_silu_kernel[(S, triton.cdiv(I, block_i))](
        x, w_gu, ids, y, w_gu if scale is None else scale, I, H, S // x.shape[0],
        USE_DOT=use_dot, DOT=dot_dtype(), BI=block_i, BK=block_k, EVEN_K=H % block_k == 0,
        MANUAL_RNE=_manual_rne(y.dtype), ROW_SCALE=mode == 1, num_warps=num_warps,
        **_stages(num_stages))
    return y


def moe_gate_up_silu(x, w_gu, ids, scale=None):
    """Dispatching entry point; see the module docstring."""
    fn = moe_gate_up_silu_triton if use_triton(x) else moe_gate_up_silu_ref
    return fn(x, w_gu, ids, scale=scale)


# --------------------------------------------------------------------------------------------
# moe_down_combine


def moe_down_combine_ref(act, w_down, ids, weights, B, k, scale=None):
    """Torch reference in fp32 (what the fused kernel computes), cast once to act's dtype."""
    down = torch.einsum("sk,snk->sn", act.float(), dequantize_experts(w_down, scale, ids))
    out = (down.view(B, k, -1) * weights.float().view(B, k, 1)).sum(1)
    return out.to(act.dtype)


@triton.jit
def _down_combine_kernel(a_ptr, w_ptr, ids_ptr, wt_ptr, y_ptr, s_ptr, H, I,
                         KS: tl.constexpr, USE_DOT: tl.constexpr, DOT: tl.constexpr,
                         BH: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                         MANUAL_RNE: tl.constexpr, ROW_SCALE: tl.constexpr,
                         SPLIT: tl.constexpr, KSPLIT: tl.constexpr, KCH: tl.constexpr,
                         ATOMIC: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    rows = hb * BH + tl.arange(0, BH)
    hmask = rows < H
    kk = tl.arange(0, BK)
    offs = rows[:, None] * I + kk[None, :]  # [BH, BK]
    # slot / K split (SPLIT, KSPLIT > 1): program (b, hb, g + SPLIT·kb) takes the slots
    # j ≡ g (mod SPLIT) over the KCH-wide K chunk kb and atomically adds its partial sums
    EVEN_S: tl.constexpr = KS % SPLIT == 0  # else the last slot of some groups is dead
    if SPLIT > 1:
        g = tl.program_id(2) % SPLIT
    if KSPLIT > 1:
        k_lo = tl.program_id(2) // SPLIT * KCH
        k_hi = tl.minimum(k_lo + KCH, I)
    else:
        k_lo = 0
        k_hi = I
    if USE_DOT:
        one = tl.arange(0, 16)
        out = tl.zeros([BH], tl.float32)
    else:
        acc = tl.zeros([BH, BK], tl.float32)
    # the slots unrolled: their (independent) expert tiles' loads can all be in flight at once
    for i in tl.static_range((KS + SPLIT - 1) // SPLIT):
        if SPLIT == 1:
            s = b * KS + i
        else:
            s = b * KS + g + i * SPLIT
        smask = hmask  # the rows' mask, and this slot's when it may be dead
        if EVEN_S:
            e = tl.load(ids_ptr + s).to(tl.int64)
            wt = tl.load(wt_ptr + s).to(tl.float32)
        else:  # a dead slot: expert 0, weight 0, and every load masked off (no traffic)
            live = g + i * SPLIT < KS
            smask = rows < tl.where(live, H, 0)  # (bounds, not `& live`: the interpreter
            a_lim = tl.where(live, I, 0)  # turns a tensor & scalar bool into int32)
            e = tl.load(ids_ptr + s, mask=live, other=0).to(tl.int64)
            wt = tl.load(wt_ptr + s, mask=live, other=0.0).to(tl.float32)
        a_row = a_ptr + s.to(tl.int64) * I
        w_base = w_ptr + e * H * I  # scalar int64 base, int32 offset tile
        if ROW_SCALE:  # this slot's expert's row scales
            sc = tl.load(s_ptr + e * H + rows, mask=smask, other=0.0).to(tl.float32)
        if USE_DOT:
            acc16 = tl.zeros([16, BH], tl.float32)
        for k in range(k_lo, k_hi, BK):
            wmask = smask[:, None]
            if not EVEN_K:  # an I tail (tiny test shapes)
                wmask = wmask & (k + kk < I)[None, :]
            if not ROW_SCALE:
                w = tl.load(w_base + k + offs, mask=wmask, other=0.0)
            else:  # e4m3 codes, as in the gate|up kernel
                w = tl.load(w_base + k + offs, mask=wmask).to(tl.float32)
                if not USE_DOT:  # the accumulator sums slots of different experts
                    w = w * sc[:, None]
                if not EVEN_K or not EVEN_S:
                    w = tl.where(wmask, w, 0.0)
            if USE_DOT:
                amask = (one == 0)[:, None]
                if not EVEN_S:
                    amask = amask & (k + kk < a_lim)[None, :]
                elif not EVEN_K:
                    amask = amask & (k + kk < I)[None, :]
                at = tl.load(a_row + (k + kk)[None, :] + one[:, None] * 0, mask=amask,
                             other=0.0)
                acc16 += tl.dot(at.to(DOT), tl.trans(w.to(DOT)))
            else:
                if EVEN_K and EVEN_S:
                    av = tl.load(a_row + k + kk)
                elif EVEN_S:
                    av = tl.load(a_row + k + kk, mask=k + kk < I, other=0.0)
                else:
                    av = tl.load(a_row + k + kk, mask=k + kk < a_lim, other=0.0)
                # the slot weight folded into the fp32 activation: one reduction at the end
                acc += w.to(tl.float32) * (av.to(tl.float32) * wt)[None, :]
        if USE_DOT:
            part = tl.sum(acc16, axis=0)  # rows 1..15 are zero
            if ROW_SCALE:  # exact e4m3 codes went into the bf16 dot; scaled after
                part = part * sc
            out += wt * part
    if not USE_DOT:
        out = tl.sum(acc, axis=1)
    if ATOMIC:  # fp32 partial sums into the zeroed fp32 output: no rounding here
        tl.atomic_add(y_ptr + b * H + rows, out, mask=hmask, sem="relaxed")
    else:
        if MANUAL_RNE:
            out = _round_bf16(out)
        tl.store(y_ptr + b * H + rows, out.to(y_ptr.dtype.element_ty), mask=hmask)


def moe_down_combine_triton(act, w_down, ids, weights, B, k, block_h=None, block_k=None,
                            use_dot=False, num_warps=None, num_stages=None, scale=None, *,
                            slot_split=1, k_split=1, out=None):
    """Triton path: one program per (row b, block of H outputs), looping over the k slots
    (unrolled: k is a compile-time constant). Tiles default to `DOWN_TILES` (block_h 8: 256
    programs per row at H = 2048, ~2 per H200 SM at B = 1), block_h 16 with `use_dot` (tl.dot
    needs N ≥ 16). `scale`: see `moe_dequant.scale_layout` (None: bf16 weights, the unchanged
    kernel).

    `slot_split` S > 1 / `k_split` > 1 (bf16 and fp8-row experts; not group scales): the grid
    gains a third axis of S · k_split programs; program (b, hb, g + S·kb) takes the slots
    j ≡ g (mod S) (the last of a group is masked off, no traffic, when S does not divide k)
    over the kb-th of k_split chunks of I (whole block_k tiles: a chunk past I only adds
    zeros), and `tl.atomic_add`s its fp32 partial sums (slot weights folded in and row scales
    applied as in one program) into an fp32 [B, H] buffer. Rounding and order: the sum stays
    in fp32, nothing is rounded to bf16 in the kernel (no MANUAL_RNE step); the order in which
    the partials land varies from run to run, so the last fp32 bits do too (not with two
    partials: 0 + a + b is exact in either order).

    `out`: a caller's ZEROED fp32 [B, H] buffer (contiguous, on act's device). The result is
    added into it (atomically with a split; without one, S = k_split = 1, it is stored, which
    over zeros is the same) and `out` itself is returned, fp32: no zero fill or bf16 cast
    runs here (the decode step zeroes every layer's buffer in one launch; its RMSNorm reads
    fp32). Without `out`: S = k_split = 1 returns a new act-dtype tensor as always (the same
    kernel, bit for bit); with a split, a zeroed fp32 buffer is allocated and returned cast to
    act's dtype (one torch rounding, to nearest even)."""
    if block_h is None and use_dot:
        block_h = 16
    E, H, I = w_down.shape
    assert act.shape == (B * k, I) and ids.shape[0] == B * k, (act.shape, ids.shape, B, k)
    assert weights.numel() == B * k, weights.shape
    assert 1 <= slot_split <= k and k_split >= 1, (slot_split, k_split, k)
    mode = scale_layout(w_down, scale)[0]
    block_h, block_k, num_warps = _tile(DOWN_TILES, mode, B, block_h, block_k, num_warps)
    block_k = min(block_k, max(16, triton.next_power_of_2(I)))
    atomic = slot_split > 1 or k_split > 1
    if out is not None:
        assert out.dtype == torch.float32 and out.shape == (B, H) and out.is_contiguous(), (
            out.dtype, out.shape)
        assert out.device == act.device, (out.device, act.device)
        y = out
    elif atomic:
        y = torch.zeros(B, H, device=act.device, dtype=torch.float32)
    else:
        y = torch.empty(B, H, device=act.device, dtype=act.dtype)
    act, weights = act.contiguous(), weights.contiguous()
    if mode == 2:
        if atomic:
            raise NotImplementedError("slot_split / k_split: bf16 and fp8-row experts only")
        from .moe_fp8_groups import down_combine_groups
        return down_combine_groups(act, w_down, ids, weights, scale, y, B, k, block_h, block_k,
                                   num_warps, _manual_rne(y.dtype))
    # K chunks of whole block_k tiles (KCH is unused, 0, without a K split)
    kch = triton.cdiv(triton.cdiv(I, k_split), block_k) * block_k if k_split > 1 else 0
    _down_combine_kernel[(B, triton.cdiv(H, block_h), slot_split * k_split)](
        act, w_down, ids, weights, y, w_down if scale is None else scale, H, I, k,
        USE_DOT=use_dot, DOT=dot_dtype(), BH=block_h, BK=block_k, EVEN_K=I % block_k == 0,
        MANUAL_RNE=_manual_rne(y.dtype), ROW_SCALE=mode == 1, SPLIT=slot_split,
        KSPLIT=k_split, KCH=kch, ATOMIC=atomic, num_warps=num_warps, **_stages(num_stages))
    return y if out is not None or not atomic else y.to(act.dtype)


def moe_down_combine(act, w_down, ids, weights, B, k, scale=None):
    """Dispatching entry point; see the module docstring."""
    fn = moe_down_combine_triton if use_triton(act) else moe_down_combine_ref
    return fn(act, w_down, ids, weights, B, k, scale=scale)
