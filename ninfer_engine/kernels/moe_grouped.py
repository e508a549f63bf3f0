"""A prompt step's routed experts as two grouped GEMMs over the stacks in their stored form.

The rows of a step's routing (token t's slot j is flat row t·k + j) are sorted by expert
(`order`, stable); expert e owns sorted rows `[starts[e], starts[e] + counts[e])`. Each GEMM
program takes one `BM`-row tile of one expert's rows and one `BN`-column tile of its output; the
tiles of expert e are numbered after those of experts < e (`tile_ends`, a cumulative count kept
on the device: no host sync), and the grid launches the most tiles any routing can need
(⌈S / BM⌉ + E), the surplus programs returning at once. The column tiles of one row tile are
neighbours in launch order (the grid's fast axis): its A rows come from HBM once and from L2 for
the other column tiles, where row-tile-fastest order streamed the whole A operand once per
column tile.

`tile_plan(counts, rows)`: the row tiles, computed once for both GEMMs of a layer; their height
grows with the rows an expert (`ROW_TILES`), each height a kernel variant of its own.
`moe_grouped_swiglu(x, order, top_k, tiles, w, scale)`
    act [S, I] = SiLU(gate)·up of sorted row r = token `order[r] // top_k` of `x` [T, H] through
    its expert's gate|up [2I, H] (the A tile is gathered from `x`: the sorted copy of the
    tokens is never written); SiLU and the product in fp32, rounded once (as the decode
    kernels, `moe_fused`).
`moe_grouped_down(act, order, weights, tiles, w, scale)`
    slots [T·k, H]: row `order[r]` = routing weight · (act[r] @ its expert's down [H, I]ᵀ),
    rounded once, stored straight in (token, slot) order; the caller sums the k slots.

A stack is bf16 (scale None) or e4m3 codes with row scales `[E, N]` or G-column group scales
`[E, N, K // G]` (`moe_dequant.scale_layout`). Codes become bf16 in registers (exact: every
e4m3 value is a bf16 value) and the scales multiply fp32 sums, never a rounded weight: a row
scale the accumulator after the dot, a group scale each K tile's dot (a tile inside one group,
of ≥ 16 columns: `grouped_supports`). The fp8 stacks are read once, 1 byte a weight: no bf16
copy of the routed experts is written first (the H200's 8-layer 35B-A3B shape spent 0.33 ms a
layer on that copy and 0.34 ms on the GEMM at 8 prompts of 955 tokens).

`fp8_act=True` (an fp8-row stack, K tiles ≥ 32): each GEMM's A operand is first rounded to
e4m3 with one power-of-two scale a row (`act_quant.quantize_rows`: x's tokens, then the
SwiGLU output's rows) and the dots multiply codes by codes in the fp8 tensor cores, the row
scales of both sides multiplying the fp32 sums; launch sizes `LAUNCH_FP8` (swept at 64- and
128-row tiles: `fp8_act_supported`). Under the interpreter the codes are fp32 operands.

The Triton kernels themselves are `moe_grouped_kernels`'; this module plans the tiles, picks the
launch sizes, builds the operands and launches them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, has_e4m3, interpreting
from .act_quant import quantize_rows
from .moe_dequant import scale_layout
from .moe_fused import _manual_rne
from .moe_grouped_kernels import _down_kernel, _swiglu_kernel


@dataclass(frozen=True)
class Tiles:
    """A routing's row tiles, shared by its two GEMMs (`tile_plan`)."""

    bm: int  # rows a tile
    counts: torch.Tensor  # [E] rows of each expert
    starts: torch.Tensor  # [E] int32 first sorted row of each expert
    tile_ends: torch.Tensor  # [E] int32 cumulative tile count
    grid_m: int  # row tiles launched: the most any routing of these rows can need


# (rows an expert from, row tile): an expert's rows fill whole tiles, so short prompts take
# 16-row tiles (H200, 35B-A3B layer: 3.8 rows an expert 381 µs against 443; 30 rows 640 against
# 476) and long ones 128-row tiles (239 rows: both GEMMs 1,427 µs against 1,798)
ROW_TILES = ((0, 16), (16, 64), (128, 128))


def row_tile(rows: int, experts: int) -> int:
    """The row tile `tile_plan` takes for `rows` sorted rows over `experts` (the interpreter:
    16, its cheapest)."""
    if interpreting():
        return 16
    return max(bm for start, bm in ROW_TILES if rows >= start * experts)


def tile_plan(counts: torch.Tensor, rows: int, block_m: int | None = None) -> Tiles:
    """The tiles of `rows` expert-sorted rows, `counts[e]` of them expert e's (on the device)."""
    E = counts.shape[0]
    bm = block_m or row_tile(rows, E)
    rows32 = counts.to(torch.int32)
    starts = torch.cumsum(rows32, 0, dtype=torch.int32) - rows32
    tile_ends = torch.cumsum((rows32 + bm - 1) // bm, 0, dtype=torch.int32)
    return Tiles(bm, counts, starts, tile_ends, triton.cdiv(rows, bm) + E)


# (BN, BK, warps, stages) of each kernel by row tile: the fastest of `moe_grouped_bench.py
# --tiles` on the H200 (a 35B-A3B layer at 955, 4,096 and 7,640 tokens;
# bench/results/h200-moe-grouped-tiles.md); 16-row tiles were not swept
LAUNCH = {"swiglu": {16: (64, 64, 4, 3), 64: (64, 64, 4, 3), 128: (64, 64, 4, 3)},
          "down": {16: (64, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 4, 4)}}
# the same with e4m3 activations (`fp8_act`), `--fp8-tiles` (h200-moe-fp8-act.md; with H and
# I compile-time, h200-moe-fp8-tiles-constexpr.md): K tiles of 128, the fp8 MMA's K being
# twice bf16's; the down GEMM's 64-row tiles 128 columns wide since the grid runs a row tile's
# column tiles side by side (H100: 126.9 µs against 143.0 at 955 tokens, h100-moe-grouped-order.md)
LAUNCH_FP8 = {"swiglu": {64: (64, 128, 4, 3), 128: (64, 128, 4, 3)},
              "down": {64: (128, 128, 4, 3), 128: (64, 128, 4, 3)}}
FP8_ACT_ROW_TILES = (64, 128)  # the row tiles swept with e4m3 activations


def fp8_act_supported(w: torch.Tensor, scale: torch.Tensor | None, bm: int) -> bool:
    """Whether the kernels take e4m3 activations for this stack at row tile `bm`: an fp8-row
    stack (row scales multiply whole sums) at a row tile whose launch sizes were swept, on a
    GPU whose tensor cores multiply e4m3 (sm89+: Triton compiles no fp8 dot below; the
    interpreter's codes are fp32 operands)."""
    return (scale_layout(w, scale)[0] == 1 and bm in FP8_ACT_ROW_TILES
            and (not w.is_cuda or has_e4m3(w.device)))


def _launch(kernel: str, bm: int, block_n, block_k, num_warps, num_stages,
            fp8_act: bool = False) -> tuple:
    """The given sizes, each None taken from `LAUNCH` (a row tile it lacks: 64-row's), or
    `LAUNCH_FP8` with e4m3 activations."""
    launch = LAUNCH_FP8 if fp8_act else LAUNCH
    table = launch[kernel].get(bm, launch[kernel][64])
    return tuple(t if v is None else v
                 for v, t in zip((block_n, block_k, num_warps, num_stages), table))


def _stack(w, scale, block_k: int):
    """(mode, G, scale operand, K tile): a group-scaled stack's K tiles stay inside a group."""
    mode, G, _ = scale_layout(w, scale)
    if mode == 2:
        assert G >= 16, f"{G}-column scale groups: a tl.dot tile needs at least 16 columns"
        block_k = min(block_k, G)
    return mode, G, (w if scale is None else scale.contiguous()), block_k


def grouped_supports(scale: torch.Tensor | None, w: torch.Tensor) -> bool:
    """Whether a stack's layout runs here: bf16, row scales, or scale groups of ≥ 16 columns."""
    mode, G, _ = scale_layout(w, scale)
    return mode != 2 or G >= 16


def _operand(a: torch.Tensor, fp8_act: bool, mode: int, block_k: int):
    """(A operand, its row scales, dot dtype): e4m3 codes and scales with `fp8_act` (an
    fp8-row stack's: row scales multiply whole sums; K tiles of ≥ 32, an fp8 MMA's least),
    else `a` itself (the scales unused)."""
    if not fp8_act:
        return a, a, dot_dtype()
    assert mode == 1, "fp8 activations need an fp8-row stack"
    assert block_k >= 32, f"fp8 dots take K tiles of 32 or more, not {block_k}"
    codes, scales = quantize_rows(a)
    # under the interpreter the codes widen to fp32 operands, exactly (its dot of narrow
    # floats is not to be trusted: `dot_dtype`)
    return codes, scales, tl.float32 if interpreting() else tl.float8e4nv


def moe_grouped_swiglu(x: torch.Tensor, order: torch.Tensor, top_k: int, tiles: Tiles,
                       w: torch.Tensor, scale: torch.Tensor | None = None,
                       block_n: int | None = None, block_k: int | None = None,
                       num_warps: int | None = None, num_stages: int | None = None,
                       fp8_act: bool = False) -> torch.Tensor:
    """See the module docstring. x [T, H]; order [S] (flat routing rows, expert-sorted);
    `tiles` of its S rows; w [E', 2I, H] (E' ≥ E: a stack may hold the shared expert after the
    routed). The tile and launch sizes (None: `LAUNCH`'s) are `bench/moe_grouped_bench.py
    --tiles`'s to sweep."""
    S, H = order.shape[0], x.shape[1]
    E, I = tiles.counts.shape[0], w.shape[1] // 2
    out = torch.empty(S, I, dtype=x.dtype, device=x.device)
    if S == 0:
        return out
    block_n, block_k, num_warps, num_stages = _launch("swiglu", tiles.bm, block_n, block_k,
                                                      num_warps, num_stages, fp8_act)
    mode, G, s, block_k = _stack(w, scale, block_k)
    a, a_scale, dot = _operand(x.contiguous(), fp8_act, mode, block_k)
    _swiglu_kernel[(triton.cdiv(I, block_n), tiles.grid_m)](
        a, a_scale, order, tiles.tile_ends, tiles.starts, tiles.counts, w, s, out, top_k,
        I, H, E=E, EP=triton.next_power_of_2(E), MODE=mode, G=G, BM=tiles.bm, BN=block_n,
        BK=block_k, DOT=dot, MANUAL_RNE=_manual_rne(out.dtype), FP8_ACT=fp8_act,
        num_warps=num_warps, num_stages=num_stages)
    return out


def moe_grouped_down(act: torch.Tensor, order: torch.Tensor, weights: torch.Tensor,
                     tiles: Tiles, w: torch.Tensor, scale: torch.Tensor | None = None,
                     block_n: int | None = None, block_k: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None,
                     fp8_act: bool = False) -> torch.Tensor:
    """See the module docstring. act [S, I] (expert-sorted rows); order [S]; weights [S] (flat
    routing weights in (token, slot) order); `tiles` of the S rows; w [E', H, I] -> slots
    [S, H]."""
    S, I = act.shape
    E, H = tiles.counts.shape[0], w.shape[1]
    out = torch.empty(S, H, dtype=act.dtype, device=act.device)
    if S == 0:
        return out
    block_n, block_k, num_warps, num_stages = _launch("down", tiles.bm, block_n, block_k,
                                                      num_warps, num_stages, fp8_act)
    mode, G, s, block_k = _stack(w, scale, block_k)
    a, a_scale, dot = _operand(act, fp8_act, mode, block_k)
    _down_kernel[(triton.cdiv(H, block_n), tiles.grid_m)](
        a, a_scale, order, weights.contiguous(), tiles.tile_ends, tiles.starts, tiles.counts,
        w, s, out, H, I, E=E, EP=triton.next_power_of_2(E), MODE=mode, G=G, BM=tiles.bm,
        BN=block_n, BK=block_k, DOT=dot, MANUAL_RNE=_manual_rne(out.dtype), FP8_ACT=fp8_act,
        num_warps=num_warps, num_stages=num_stages)
    return out
