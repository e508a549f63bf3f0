"""Fused routed-expert decode: routing, gate|up + SwiGLU, down + weighted slot sum.

Three launches replace the ~10 small ones of the torch sequence in `HybridStep._experts`:

`route_topk(logits, k, renormalise)`
    logits `[B, E]` (bf16 or fp32, E ≤ 512) → `(weights [B, k] fp32, ids [B, k] int64)`, equal
    to `w, ids = topk(softmax(logits.float(), -1), k)` (descending, as torch.topk), then
    `w / w.sum(-1, keepdim=True)` when `renormalise`. One program per row (one warp): softmax
    in fp32 registers, then k max-reductions over packed (probability bits, index) keys (k ≤ 16).
    Equal probabilities (bf16 logits do tie, e.g. 3 equal logits of 256 at the 8th slot) come
    out lowest index first; torch.topk's order among ties is unspecified (CPU and CUDA differ).

`moe_gate_up_silu(x, w_gu, ids)`
    w_gu `[E, 2I, H]` bf16 (gate rows 0..I-1, up rows I..2I-1 of each expert), ids `[S]` →
    act `[S, I]` bf16 = SiLU(x·gateᵀ) · (x·upᵀ). x is `[S, H]` (one row per slot), `[1, H]`
    (shared by every slot) or `[R, H]` with R dividing S (row s // (S/R), i.e. `[B, H]` for
    S = B·k slots laid out token-major: no expand/reshape copy of the token rows needed).
    Rounding: both dot products are accumulated in fp32 and SiLU(g)·u is taken in fp32, then
    cast once. The torch sequence `g, u = moe_gemv(x, w_gu, ids).chunk(2, -1); F.silu(g) * u`
    rounds g and u to bf16, then SiLU(g) to bf16, then the product: ~3 bf16 roundings
    (≈ 2⁻⁹ relative each) instead of one, so the two agree only to bf16 tolerance (~1e-2).

`moe_down_combine(act, w_down, ids, weights, B, k)`
    act `[B·k, I]` bf16, w_down `[E, H, I]` bf16, ids `[B·k]`, weights `[B, k]` fp32 → out
    `[B, H]` bf16 = Σ_slot weights[b, slot] · (act[b·k + slot] · w_down[ids[b·k + slot]]ᵀ).
    Rounding: everything in fp32, one cast. The torch sequence
    `(moe_gemv(act, w_down, ids).view(B, k, -1) * weights.to(bf16)[..., None]).float().sum(1)`
    rounds each slot's down output to bf16, the weights to bf16 and their product to bf16
    before the fp32 slot sum: again agreement to bf16 tolerance only. One program per (row,
    block of H outputs) loops over the k slots: no atomics, deterministic.

All ids stay on the device (no host sync), so a decode step remains graph-capturable.

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
# route_topk


def route_topk_ref(logits, k, renormalise):
    """Torch reference: the sequence of `HybridStep._experts`."""
    probs = torch.softmax(logits.float(), -1)
    weights, ids = torch.topk(probs, k, -1)
    if renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


@triton.jit
def _route_topk_kernel(logits_ptr, w_ptr, ids_ptr, E, stride,
                       K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                       RENORM: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    emask = cols < E
    x = tl.load(logits_ptr + b * stride + cols, mask=emask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(emask, p, 0.0)
    probs = p / tl.sum(p, 0)
    # one max-reduction per slot: key = (probability bits, E-1-index) as int64; probabilities
    # are ≥ 0, so their fp32 bits order like the values; equal ones go lowest index first
    bits = probs.to(tl.int32, bitcast=True).to(tl.int64)
    keys = tl.where(emask, (bits << 32) | (BLOCK_E - 1 - cols).to(tl.int64), -1)
    slots = tl.arange(0, BLOCK_K)
    wk = tl.zeros([BLOCK_K], tl.float32)
    ik = tl.zeros([BLOCK_K], tl.int64)
    for j in tl.static_range(K):
        best = tl.max(keys, 0)
        v = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        idx = BLOCK_E - 1 - (best & 0xFFFF)  # BLOCK_E ≤ 512
        wk = tl.where(slots == j, v, wk)
        ik = tl.where(slots == j, idx, ik)
        keys = tl.where(keys == best, -1, keys)
    if RENORM:
        wk = wk / tl.sum(wk, 0)
    kmask = slots < K
    tl.store(w_ptr + b * K + slots, wk, mask=kmask)
    tl.store(ids_ptr + b * K + slots, ik, mask=kmask)


def route_topk_triton(logits, k, renormalise):
    """Triton path: one program per row."""
    B, E = logits.shape
    assert E <= 512 and k <= 16 and k <= E, (E, k)
    logits = logits.contiguous()
    weights = torch.empty(B, k, device=logits.device, dtype=torch.float32)
    ids = torch.empty(B, k, device=logits.device, dtype=torch.int64)
    _route_topk_kernel[(B,)](logits, weights, ids, E, logits.stride(0), K=k,
                             BLOCK_E=triton.next_power_of_2(E),
                             BLOCK_K=max(2, triton.next_power_of_2(k)),
                             RENORM=bool(renormalise), num_warps=1)  # warp-shuffle reductions
    return weights, ids


def route_topk(logits, k, renormalise):
    """Dispatching entry point; see the module docstring."""
    return (route_topk_triton if use_triton(logits) else route_topk_ref)(logits, k, renormalise)


# --------------------------------------------------------------------------------------------
# moe_gate_up_silu


def moe_gate_up_silu_ref(x, w_gu, ids):
    """Torch reference in fp32 (what the fused kernel computes), cast once to x's dtype."""
    S = ids.shape[0]
    xs = x.float().repeat_interleave(S // x.shape[0], 0)
    gu = torch.einsum("sk,snk->sn", xs, w_gu[ids].float())
    g, u = gu.chunk(2, -1)
    return (torch.nn.functional.silu(g) * u).to(x.dtype)


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, ids_ptr, y_ptr, I, H, rep,
                         USE_DOT: tl.constexpr, DOT: tl.constexpr, BI: tl.constexpr,
                         BK: tl.constexpr, EVEN_K: tl.constexpr, MANUAL_RNE: tl.constexpr):
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
        g = tl.load(g_base + k + offs, mask=wmask, other=0.0)
        u = tl.load(u_base + k + offs, mask=wmask, other=0.0)
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
    act = gs / (1.0 + tl.exp(-gs)) * us
    if MANUAL_RNE:
        act = _round_bf16(act)
    tl.store(y_ptr + s * I + cols, act.to(y_ptr.dtype.element_ty), mask=cmask)


def moe_gate_up_silu_triton(x, w_gu, ids, block_i=16, block_k=512, use_dot=False,
                            num_warps=8, num_stages=None):
    """Triton path: one program per (slot, block of I output columns): with I = 512 and
    block_i = 16, 32 per slot, 256 at B = 1, k = 8 (~2 per H200 SM)."""
    E, I2, H = w_gu.shape
    I, S = I2 // 2, ids.shape[0]
    assert x.shape[-1] == H and S % x.shape[0] == 0, (x.shape, w_gu.shape, S)
    block_k = min(block_k, max(16, triton.next_power_of_2(H)))
    y = torch.empty(S, I, device=x.device, dtype=x.dtype)
    x = x.contiguous()
    _gate_up_silu_kernel[(S, triton.cdiv(I, block_i))](
        x, w_gu, ids, y, I, H, S // x.shape[0], USE_DOT=use_dot, DOT=dot_dtype(),
        BI=block_i, BK=block_k, EVEN_K=H % block_k == 0, MANUAL_RNE=_manual_rne(y.dtype),
        num_warps=num_warps, **_stages(num_stages))
    return y


def moe_gate_up_silu(x, w_gu, ids):
    """Dispatching entry point; see the module docstring."""
    return (moe_gate_up_silu_triton if use_triton(x) else moe_gate_up_silu_ref)(x, w_gu, ids)


# --------------------------------------------------------------------------------------------
# moe_down_combine


def moe_down_combine_ref(act, w_down, ids, weights, B, k):
    """Torch reference in fp32 (what the fused kernel computes), cast once to act's dtype."""
    down = torch.einsum("sk,snk->sn", act.float(), w_down[ids].float())  # [B·k, H]
    out = (down.view(B, k, -1) * weights.float().view(B, k, 1)).sum(1)
    return out.to(act.dtype)


@triton.jit
def _down_combine_kernel(a_ptr, w_ptr, ids_ptr, wt_ptr, y_ptr, H, I, KS: tl.constexpr,
                         USE_DOT: tl.constexpr, DOT: tl.constexpr, BH: tl.constexpr,
                         BK: tl.constexpr, EVEN_K: tl.constexpr, MANUAL_RNE: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    rows = hb * BH + tl.arange(0, BH)
    hmask = rows < H
    kk = tl.arange(0, BK)
    offs = rows[:, None] * I + kk[None, :]  # [BH, BK]
    if USE_DOT:
        one = tl.arange(0, 16)
        out = tl.zeros([BH], tl.float32)
    else:
        acc = tl.zeros([BH, BK], tl.float32)
    # the slots unrolled: their (independent) expert tiles' loads can all be in flight at once
    for j in tl.static_range(KS):
        s = b * KS + j
        e = tl.load(ids_ptr + s).to(tl.int64)
        wt = tl.load(wt_ptr + s).to(tl.float32)
        a_row = a_ptr + s.to(tl.int64) * I
        w_base = w_ptr + e * H * I  # scalar int64 base, int32 offset tile
        if USE_DOT:
            acc16 = tl.zeros([16, BH], tl.float32)
        for k in range(0, I, BK):
            wmask = hmask[:, None]
            if not EVEN_K:  # an I tail (tiny test shapes)
                wmask = wmask & (k + kk < I)[None, :]
            w = tl.load(w_base + k + offs, mask=wmask, other=0.0)
            if USE_DOT:
                amask = (one == 0)[:, None]
                if not EVEN_K:
                    amask = amask & (k + kk < I)[None, :]
                at = tl.load(a_row + (k + kk)[None, :] + one[:, None] * 0, mask=amask,
                             other=0.0)
                acc16 += tl.dot(at.to(DOT), tl.trans(w.to(DOT)))
            else:
                if EVEN_K:
                    av = tl.load(a_row + k + kk)
                else:
                    av = tl.load(a_row + k + kk, mask=k + kk < I, other=0.0)
                # the slot weight folded into the fp32 activation: one reduction at the end
                acc += w.to(tl.float32) * (av.to(tl.float32) * wt)[None, :]
        if USE_DOT:
            out += wt * tl.sum(acc16, axis=0)  # rows 1..15 are zero
    if not USE_DOT:
        out = tl.sum(acc, axis=1)
    if MANUAL_RNE:
        out = _round_bf16(out)
    tl.store(y_ptr + b * H + rows, out.to(y_ptr.dtype.element_ty), mask=hmask)


def moe_down_combine_triton(act, w_down, ids, weights, B, k, block_h=None, block_k=512,
                            use_dot=False, num_warps=4, num_stages=None):
    """Triton path: one program per (row b, block of H outputs), looping over the k slots
    (unrolled: k is a compile-time constant). block_h defaults to 8 (256 programs per row at
    H = 2048, ~2 per H200 SM at B = 1), 16 with `use_dot` (tl.dot needs N ≥ 16)."""
    if block_h is None:
        block_h = 16 if use_dot else 8
    E, H, I = w_down.shape
    assert act.shape == (B * k, I) and ids.shape[0] == B * k, (act.shape, ids.shape, B, k)
    assert weights.numel() == B * k, weights.shape
    block_k = min(block_k, max(16, triton.next_power_of_2(I)))
    y = torch.empty(B, H, device=act.device, dtype=act.dtype)
    act, weights = act.contiguous(), weights.contiguous()
    _down_combine_kernel[(B, triton.cdiv(H, block_h))](
        act, w_down, ids, weights, y, H, I, k, USE_DOT=use_dot, DOT=dot_dtype(),
        BH=block_h, BK=block_k, EVEN_K=I % block_k == 0, MANUAL_RNE=_manual_rne(y.dtype),
        num_warps=num_warps, **_stages(num_stages))
    return y


def moe_down_combine(act, w_down, ids, weights, B, k):
    """Dispatching entry point; see the module docstring."""
    fn = moe_down_combine_triton if use_triton(act) else moe_down_combine_ref
    return fn(act, w_down, ids, weights, B, k)
