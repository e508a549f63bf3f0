"""The Triton side of `kernels.dequant_gemv`: its kernels and their launchers.

`dequant_gemv_triton` launches `_dequant_gemv_kernel` on one of `kernels.dequant_gemv`'s weight
encodings (row-scaled, group-scaled or plain; that module's docstring describes them, the
variants this launcher's keyword arguments pick and the sweep behind them), with `_tiles` and
`split_k` sizing its K tiles and K split (`kernels.quant_gemv` shares `split_k`). `_gated` is
the gated input `x · act(gate)` that the batch-1 `fma` variant fuses into its loads, and
`gated_triton` the same input as one launch of its own. The encoders, the torch references and
the engine's dispatch (`dequant_gemv`, `engine_launch`, `gated`) stay in `kernels.dequant_gemv`;
everything here also runs on CPU tensors under `TRITON_INTERPRET=1`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, interpreting
from .pdl import pdl_launch, pdl_release, pdl_wait

PLAIN = (torch.bfloat16, torch.float16)  # weight dtypes taken without a scale


@triton.jit
def _gated(x, g_ptr, offs, mask, ACT: tl.constexpr):
    """x · act(gate) rounded as torch rounds `x * act(g)` on bf16 tensors: act(g) to x's dtype,
    then the product (so the fused prologue equals the two elementwise launches it replaces)."""
    if ACT == "none":
        return x
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ACT == "silu":
        a = g / (1.0 + tl.exp(-g))
    else:  # sigmoid
        a = 1.0 / (1.0 + tl.exp(-g))
    a = a.to(x.dtype).to(tl.float32)
    return (x.to(tl.float32) * a).to(x.dtype)


@triton.jit
def _gated_kernel(x_ptr, g_ptr, y_ptr, K, SXB, SGB, ACT: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + b * SXB + offs, mask=mask, other=0.0)
    tl.store(y_ptr + b * K + offs, _gated(x, g_ptr + b * SGB, offs, mask, ACT), mask=mask)


def gated_triton(x, gate, act, block=2048):
    """`gated_ref` in one launch (x and gate may be row-strided views): the GEMV's input where
    the gate does not fuse into it; rounds as `gated_ref` does."""
    B, K = x.shape
    assert gate.shape == x.shape and x.stride(-1) == 1 and gate.stride(-1) == 1
    y = torch.empty((B, K), device=x.device, dtype=x.dtype)
    _gated_kernel[(B, triton.cdiv(K, block))](x, gate, y, K, x.stride(0), gate.stride(0),
                                             ACT=act, BLOCK=block, **pdl_launch(x))
    return y


@triton.jit
def _tile_part(x_ptr, g_ptr, w_ptr, s_ptr, rows, bat, nmask, bmask, K, kg, kt, SXB,
               SCALE: tl.constexpr, DOT: tl.constexpr, KT: tl.constexpr, FMA: tl.constexpr,
               ACT: tl.constexpr):
    """Partial sums of K columns kg..kg+KT: [BN] (FMA) or [BB, BN], times the group scale when
    group-scaled (the tile is one group). x rows are SXB apart; `ACT` (FMA only) gates x."""
    cols = kg + kt
    # no `other`: an integer fill cannot be cast to fp8, and masked rows are never stored
    w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=nmask[:, None])
    if FMA:
        xv = _gated(tl.load(x_ptr + cols), g_ptr, cols, cols < K, ACT).to(tl.float32)
        part = tl.sum(w.to(tl.float32) * xv[None, :], axis=1)
    else:
        x = tl.load(x_ptr + bat[:, None] * SXB + cols[None, :], mask=bmask[:, None], other=0.0)
        if SCALE == "none":  # plain weights: already a dot operand (fp32 when interpreting)
            wd = w.to(DOT)
        else:
            wd = w.to(tl.float32).to(DOT)
        part = tl.dot(x.to(DOT), tl.trans(wd))
    if SCALE == "group":
        sc = tl.load(s_ptr + rows * (K // KT) + kg // KT, mask=nmask, other=0.0).to(tl.float32)
        if FMA:
            part = part * sc
        else:
            part = part * sc[None, :]
    return part


@triton.jit
def _dequant_gemv_kernel(x_ptr, g_ptr, w_ptr, s_ptr, y_ptr, B, N, K, k_per_split, SXB,
                         SCALE: tl.constexpr, DOT: tl.constexpr, BB: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, KT: tl.constexpr,
                         FMA: tl.constexpr, ATOMIC: tl.constexpr, STAGES: tl.constexpr,
                         ACT: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`; the next launch is released after the loop
    # BK: K per loop iteration, KT: K per load / dot (one scale group; BK otherwise).
    # SCALE: "row", "group" or "none" (plain weights; s_ptr unused); ACT: "none", "silu",
    # "sigmoid" (x · act(gate) as the one-row GEMV's input; g_ptr unused with "none")
    NT: tl.constexpr = BK // KT
    nb = tl.program_id(0)
    sk = tl.program_id(1)
    rows = nb * BN + tl.arange(0, BN)
    bat = tl.arange(0, BB)
    kt = tl.arange(0, KT)
    nmask = rows < N
    bmask = bat < B
    k0 = sk * k_per_split
    if FMA:  # no dot to pipeline the loads for: ask for it (Triton pipelines this loop's loads)
        acc = tl.zeros([BN], tl.float32)
        for k in tl.range(k0, k0 + k_per_split, BK, num_stages=STAGES):
            for t in tl.static_range(NT):
                acc += _tile_part(x_ptr, g_ptr, w_ptr, s_ptr, rows, bat, nmask, bmask, K,
                                  k + t * KT, kt, SXB, SCALE, DOT, KT, FMA, ACT)
    else:
        acc = tl.zeros([BB, BN], tl.float32)
        for k in range(k0, k0 + k_per_split, BK):
            for t in tl.static_range(NT):
                acc += _tile_part(x_ptr, g_ptr, w_ptr, s_ptr, rows, bat, nmask, bmask, K,
                                  k + t * KT, kt, SXB, SCALE, DOT, KT, FMA, ACT)
    pdl_release(PDL)
    if SCALE == "row":
        sc = tl.load(s_ptr + rows, mask=nmask).to(tl.float32)
        if FMA:
            acc = acc * sc
        else:
            acc = acc * sc[None, :]
    if FMA:  # B == 1
        out = y_ptr + sk * N + rows
        mask = nmask
    else:
        out = y_ptr + (sk * B + bat[:, None]) * N + rows[None, :]
        mask = bmask[:, None] & nmask[None, :]
    if ATOMIC:  # y: zeroed fp32 [B, N], sk not in the address
        tl.atomic_add(out - sk * B * N, acc, mask=mask, sem="relaxed")
    else:
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mask)


def split_k(n_blocks, K, block_k, sms=132):
    """K splits so that about two waves of programs cover the SMs; each split whole BK tiles."""
    tiles = K // block_k
    want = max(1, -(-2 * sms // n_blocks))
    split = min(want, tiles)
    while tiles % split:  # every split gets the same number of tiles
        split -= 1
    return split


def _tiles(K, scale, block_k, group_k):
    """(BK, KT): K per loop iteration and per load/dot."""
    if scale is not None and scale.dim() == 2:  # group-scaled: one group per load
        group = K // scale.shape[1]
        bk = group if group_k is None else min(group_k, K & -K)
        if bk % group:
            raise ValueError(f"group_k {group_k} is not a multiple of the group {group}")
        return bk, group
    # small matrices: the largest power of two dividing K (K = 96 takes BK = 32); tl.arange
    # needs a power of two and tl.dot at least 16. Real K are multiples of 256: unchanged.
    bk = min(block_k, K & -K)
    return bk, bk


def dequant_gemv_triton(x, codes, scale, block_n=64, block_k=256, num_warps=4, num_stages=3,
                        *, fma=False, atomic=False, group_k=None, split=None, gate=None,
                        act=None, out=None):
    """Triton path; K must be a multiple of `block_k` (true for every model matrix here), or of
    a smaller power of two of at least 16, which then replaces it. A group-scaled weight ignores
    `block_k` and takes `group_k` (default: one group) per loop iteration; `scale=None` takes
    `codes` as a plain weight in x's dtype (bf16/fp16). The keyword-only arguments pick a
    kernel variant (`kernels.dequant_gemv`'s docstring); the defaults are the engine's path
    for several rows.

    Fusions around the product (the decode step's, so no elementwise launch runs beside it):
    `gate`, `act` ("silu" or "sigmoid"; `fma` only): the input is `x · act(gate)`, rounded as
    torch rounds it (`_gated`); x may be a row-strided view (a half of a gate|up output).
    `out`: an fp32 `[B, N]` buffer the product is atomically added into and returned (a
    residual delta the next RMSNorm reads in fp32; no zero fill or cast per call).

    The default tile won 3 of 4 shapes of the H200 sweep in bench/results/h200-kernels.json."""
    B, K = x.shape
    N = codes.shape[0]
    if scale is None and (codes.dtype not in PLAIN or codes.dtype != x.dtype):
        raise ValueError(f"plain weights (scale None) are bf16/fp16 in x's dtype {x.dtype}, "
                         f"not {codes.dtype}")
    if fma and B != 1:
        raise ValueError("fma is the batch-1 variant")
    block_k, kt = _tiles(K, scale, block_k, group_k)
    assert K % block_k == 0 and kt >= 16 and B <= 16
    n_blocks = triton.cdiv(N, block_n)
    if split is None:
        split = split_k(n_blocks, K, block_k)
    assert (K // block_k) % split == 0, "every split takes whole K iterations"
    x = x if x.stride(-1) == 1 else x.contiguous()
    if gate is not None and not fma:  # the dot path's 16-row tiles made it 3-4x slower
        raise ValueError("the gated input is the fma (batch-1) variant's")
    if gate is not None:
        assert act in ("silu", "sigmoid") and gate.shape == x.shape and gate.stride(-1) == 1
    if out is not None:
        assert out.dtype == torch.float32 and out.shape == (B, N) and out.is_contiguous()
        y, atomic = out, True
    elif atomic and split > 1:
        y = torch.zeros((B, N), device=x.device, dtype=torch.float32)
    else:
        atomic = False
        y = torch.empty((split, B, N), device=x.device,
                        dtype=x.dtype if split == 1 else torch.float32)
    if scale is None:  # the weight's own dtype (an fp16 weight is not rounded to bf16)
        kind = "none"
        dot = tl.float32 if interpreting() else {torch.bfloat16: tl.bfloat16,
                                                  torch.float16: tl.float16}[codes.dtype]
    else:  # bf16, or fp32 under the interpreter (its dot mishandles bf16: `dot_dtype`)
        kind = "group" if scale.dim() == 2 else "row"
        dot = dot_dtype()
    g = x if gate is None else gate
    _dequant_gemv_kernel[(n_blocks, split)](
        x, g, codes, codes if scale is None else scale, y, B, N, K, K // split,
        x.stride(0), SCALE=kind, DOT=dot, BB=16, BN=block_n, BK=block_k, KT=kt,
        FMA=fma, ATOMIC=atomic, STAGES=num_stages, ACT="none" if gate is None else act,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(x))
    if out is not None:
        return out
    if atomic:
        return y.to(x.dtype)
    return y[0] if split == 1 else y.sum(0).to(x.dtype)
