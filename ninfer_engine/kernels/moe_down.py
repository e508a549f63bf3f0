"""Fused routed-expert decode, second half: down projection + the weighted slot sum.

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
    last fp32 bits, vary from run to run. S = K = 1 without `out` is the one-program kernel, bit
    for bit (the same PTX for sm_90).

fp8 experts and the `use_dot` formulation: as gate|up's (`kernels.moe_fused`'s docstring).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, use_triton
from .moe_dequant import dequantize_experts, scale_layout
from .moe_fused import _manual_rne, _round_bf16, _stages, _tile, remap_args, remap_expert
from .pdl import pdl_launch, pdl_release, pdl_wait

# (block_h, block_k, num_warps) by (scale mode, one row): the slot sweep's picks
# (bench/results/h200-moe-slots.md, as GATE_UP_TILES in moe_fused)
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


def moe_down_combine_ref(act, w_down, ids, weights, B, k, scale=None):
    """Torch reference in fp32 (what the fused kernel computes), cast once to act's dtype."""
    down = torch.einsum("sk,snk->sn", act.float(), dequantize_experts(w_down, scale, ids))
    out = (down.view(B, k, -1) * weights.float().view(B, k, 1)).sum(1)
    return out.to(act.dtype)


@triton.jit
def _down_combine_kernel(a_ptr, w_ptr, ids_ptr, wt_ptr, y_ptr, s_ptr, H, I,
                         map_ptr, host_w, host_s, KS: tl.constexpr, USE_DOT: tl.constexpr,
                         DOT: tl.constexpr,
                         BH: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                         MANUAL_RNE: tl.constexpr, ROW_SCALE: tl.constexpr,
                         SPLIT: tl.constexpr, KSPLIT: tl.constexpr, KCH: tl.constexpr,
                         ATOMIC: tl.constexpr, REMAP: tl.constexpr = 0,
                         PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`; the next launch is released after the slot loop
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
        w_at, s_at = w_ptr, s_ptr
        if REMAP:  # a dead slot's expert 0 is remapped too: its loads stay masked off
            e, w_at, s_at = remap_expert(e, map_ptr, w_ptr, s_ptr, host_w, host_s)
        w_base = w_at + e * H * I  # scalar int64 base, int32 offset tile
        if ROW_SCALE:  # this slot's expert's row scales
            sc = tl.load(s_at + e * H + rows, mask=smask, other=0.0).to(tl.float32)
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
    pdl_release(PDL)
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
                            slot_split=1, k_split=1, out=None, remap=None):
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
    act's dtype (one torch rounding, to nearest even).

    `remap`: ids are experts, read through a `moe_fused.Remap` (bf16 and fp8-row only)."""
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
        assert remap is None, "remap: bf16 and fp8-row experts only"
        if atomic:
            raise NotImplementedError("slot_split / k_split: bf16 and fp8-row experts only")
        from .moe_fp8_groups import down_combine_groups
        return down_combine_groups(act, w_down, ids, weights, scale, y, B, k, block_h, block_k,
                                   num_warps, _manual_rne(y.dtype))
    # K chunks of whole block_k tiles (KCH is unused, 0, without a K split)
    kch = triton.cdiv(triton.cdiv(I, k_split), block_k) * block_k if k_split > 1 else 0
    _down_combine_kernel[(B, triton.cdiv(H, block_h), slot_split * k_split)](
        act, w_down, ids, weights, y, w_down if scale is None else scale, H, I,
        *remap_args(remap, ids), k, REMAP=remap is not None, USE_DOT=use_dot, DOT=dot_dtype(),
        BH=block_h, BK=block_k, EVEN_K=I % block_k == 0,
        MANUAL_RNE=_manual_rne(y.dtype), ROW_SCALE=mode == 1, SPLIT=slot_split,
        KSPLIT=k_split, KCH=kch, ATOMIC=atomic, num_warps=num_warps, **_stages(num_stages),
        **pdl_launch(act))
    return y if out is not None or not atomic else y.to(act.dtype)


def moe_down_combine(act, w_down, ids, weights, B, k, scale=None):
    """Dispatching entry point; see the module docstring."""
    fn = moe_down_combine_triton if use_triton(act) else moe_down_combine_ref
    return fn(act, w_down, ids, weights, B, k, scale=scale)
