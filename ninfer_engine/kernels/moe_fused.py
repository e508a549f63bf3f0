"""Fused routed-expert decode: routing, gate|up + SwiGLU, down + weighted slot sum.

Three launches replace the ~10 small ones of the torch sequence in `HybridStep._moe`:
`route_topk` (routing, `kernels.moe_route`, re-exported here), the one below, and down + the
weighted slot sum (`kernels.moe_down`, which shares this module's tile and rounding helpers).

`moe_gate_up_silu(x, w_gu, ids, scale=None)`
    w_gu `[E, 2I, H]` bf16 (gate rows 0..I-1, up rows I..2I-1 of each expert), ids `[S]` →
    act `[S, I]` bf16 = SiLU(x·gateᵀ) · (x·upᵀ). x is `[S, H]` (one row per slot), `[1, H]`
    (shared by every slot) or `[R, H]` with R dividing S (row s // (S/R), i.e. `[B, H]` for
    S = B·k slots laid out token-major: no expand/reshape copy of the token rows needed).
    Rounding: both dot products are accumulated in fp32 and SiLU(g)·u is taken in fp32, then
    cast once. The torch sequence `g, u = moe_gemv(x, w_gu, ids).chunk(2, -1); F.silu(g) * u`
    rounds g and u to bf16, then SiLU(g) to bf16, then the product: ~3 bf16 roundings
    (≈ 2⁻⁹ relative each) instead of one, so the two agree only to bf16 tolerance (~1e-2).

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

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, interpreting, use_triton
from .moe_dequant import dequantize_experts, scale_layout
from .moe_route import route_topk, route_topk_ref, route_topk_triton  # noqa: F401 (re-exported)
from .pdl import pdl_launch, pdl_release, pdl_wait


@triton.jit
def _round_bf16(x):
    """fp32 → bf16 rounded to nearest even, by hand. On GPUs `.to(bf16)` does that (cvt.rn);
    the interpreter (Triton 3.9) truncates, so there the kernels round with this, to be tested
    against a once-rounded fp32 reference. Finite values only (NaN payloads are not kept)."""
    u = x.to(tl.uint32, bitcast=True)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def remap_expert(e, map_ptr, w_ptr, s_ptr, host_w, host_s):
    """`Remap`: expert e's row and the weight and scale bases it is read from: the device
    slot stacks, or (map entry -1 - e) the host stacks `host_w`/`host_s` elements away."""
    r = tl.load(map_ptr + e).to(tl.int64)
    host = r < 0
    w_at = w_ptr + tl.where(host, host_w, 0).to(tl.int64)
    s_at = s_ptr + tl.where(host, host_s, 0).to(tl.int64)
    return tl.where(host, -1 - r, r), w_at, s_at


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
                         map_ptr, host_w, host_s,
                         USE_DOT: tl.constexpr, DOT: tl.constexpr, BI: tl.constexpr,
                         BK: tl.constexpr, EVEN_K: tl.constexpr, MANUAL_RNE: tl.constexpr,
                         ROW_SCALE: tl.constexpr, REMAP: tl.constexpr = 0,
                         PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    s = tl.program_id(0)
    ib = tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    if REMAP:  # expert -> its slot, or -1 - expert where it is read from host memory
        e, w_ptr, s_ptr = remap_expert(e, map_ptr, w_ptr, s_ptr, host_w, host_s)
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


def _tile(table, mode, rows, block, block_k, num_warps):
    """The caller's tile where given, else the table's for this scale mode and row count."""
    tb, tk, tw = table[mode, rows == 1]
    return (tb if block is None else block, tk if block_k is None else block_k,
            tw if num_warps is None else num_warps)


def moe_gate_up_silu_triton(x, w_gu, ids, block_i=None, block_k=None, use_dot=False,
                            num_warps=None, num_stages=None, scale=None, remap=None):
    """Triton path: one program per (slot, block of I output columns): with I = 512 and
    block_i = 16, 32 per slot, 288 at B = 1 with 8 routed slots and the shared one (~2 per
    H200 SM). Tiles default to `GATE_UP_TILES`. `scale`: see `moe_dequant.scale_layout` (None:
    bf16 weights, the unchanged kernel). `remap`: ids are experts, read through a `Remap`
    (`experts.in_place`: device slots or page-locked host memory; not group scales)."""
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
        assert remap is None, "remap: bf16 and fp8-row experts only"
        from .moe_fp8_groups import gate_up_silu_groups
        return gate_up_silu_groups(x, w_gu, ids, scale, y, block_i, block_k, num_warps,
                                   _manual_rne(y.dtype))
    _gate_up_silu_kernel[(S, triton.cdiv(I, block_i))](
        x, w_gu, ids, y, w_gu if scale is None else scale, I, H, S // x.shape[0],
        *remap_args(remap, ids), REMAP=remap is not None, USE_DOT=use_dot, DOT=dot_dtype(),
        BI=block_i, BK=block_k, EVEN_K=H % block_k == 0,
        MANUAL_RNE=_manual_rne(y.dtype), ROW_SCALE=mode == 1, num_warps=num_warps,
        **_stages(num_stages), **pdl_launch(x))
    return y


@dataclass(frozen=True)
class Remap:
    """Where the expert kernels read each routed expert (`experts.in_place`): `table [E]`
    int64 on the device holds its slot in the stacks passed to the kernel, or -1 - e where it
    is read in place from the host stacks, which start `host_w` / `host_s` elements after the
    slot stacks' weights / scales (page-locked host memory is in the device's address space
    under unified addressing: the same pointer on both sides)."""

    table: torch.Tensor
    host_w: int
    host_s: int


def remap_args(remap: Remap | None, ids: torch.Tensor) -> tuple:
    """The kernels' (map_ptr, host_w, host_s) arguments (unused placeholders without one)."""
    return (ids, 0, 0) if remap is None else (remap.table, remap.host_w, remap.host_s)


def moe_gate_up_silu(x, w_gu, ids, scale=None):
    """Dispatching entry point; see the module docstring."""
    fn = moe_gate_up_silu_triton if use_triton(x) else moe_gate_up_silu_ref
    return fn(x, w_gu, ids, scale=scale)
