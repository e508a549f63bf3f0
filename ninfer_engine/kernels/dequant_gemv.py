"""Batch-1..16 matmul `y = x Wᵀ` with quantised weights, dequantisation fused into the loads.

Weight encodings, kept as plain tensors:
* row-scaled: codes `[N, K]` (float8_e4m3fn, ninfer-format.md §2.3 fp8-row) and one scale per
  row `[N]`;
* group-scaled: codes `[N, K]` (int8, or float8_e4m3fn) and one scale per G consecutive K
  `[N, K // G]`, G a power of two ≥ 16: q8_g32 (§2.1's Q8 values), and the fp8 form the engine
  repacks Q4/Q5 groups into (their codes are exact in e4m3; `models.packed`);
* plain: the weight itself `[N, K]` in x's dtype (bf16 or fp16) and `scale=None`; the loads
  only widen to fp32 (`fma`) or feed the dot as they are. Here to time the `fma` variant
  against cuBLAS at batch 1 (bench/fp8_gemv_sweep.py `--formats bf16`); the engine does not
  route plain weights here.
x is `[B, K]` bf16 (or the plain weight's dtype), y `[B, N]` in x's dtype; accumulation is
fp32. The Triton path tiles N, splits K across programs when N alone cannot fill the GPU, and
feeds bf16 tiles to `tl.dot` (codes -> fp32 -> bf16); a group-scaled weight takes K tiles of
exactly one group, so each tile's partial sums are scaled by one value per row.
The kernels and their launchers are in `kernels.dequant_gemv_kernels`.

Variants, keyword arguments of `dequant_gemv_triton` (defaults = the path above; the engine's
choice among them is `engine_launch`):
* `fma` (B = 1 only): no `tl.dot`; fp32 products summed over each row of the tile (the loop
  is a `tl.range` with `num_stages`, so that Triton pipelines its loads without a dot).
* `atomic`: with a K split, partial sums `tl.atomic_add`-ed into a zeroed fp32 `[B, N]` instead
  of a `[split, B, N]` buffer summed by torch.
* `group_k` (group-scaled): K per loop iteration, a multiple of the group (default: one
  group); each group is still loaded, multiplied and scaled on its own.
* `split`: the K split (default `split_k`).

The H200 sweep (bench/results/h200-fp8-gemv.md, every row in its .json) also tried variants
since removed. At one tile, in speed relative to the code -> fp32 -> bf16 dot (geometric mean
over its 36 cases): one fp8 -> bf16 conversion 0.81×, the weight as the dot's M operand
(`dot(w, xᵀ)`) 0.73×, fp16 dots with each x row scaled by a power of two into fp16's range
0.69×, fp16 operands built from the e4m3 bits by integer ops 0.53× or inline PTX 0.64× (0.89×
of `fma` at B = 1). Only the unguarded fp16 dot won (best at B = 8 by 2–25 %), and it overflows
on activations above 65504, which down/o projection inputs can reach.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from ._dispatch import use_triton
from .dequant_gemv_kernels import dequant_gemv_triton, gated_triton, split_k

Q8_GROUP = 32


def quantize_fp8_row(w):
    """[N, K] float -> (e4m3 codes, bf16 row scales), absmax of each row mapped to 448."""
    scale = (w.float().abs().amax(1) / 448.0).clamp_min(1e-12).to(torch.bfloat16)
    codes = (w.float() / scale.float()[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes, scale


def quantize_q8_g32(w):
    """[N, K] float -> (int8 codes, fp16 scales [N, K // 32]), symmetric absmax per group."""
    g = w.float().unflatten(1, (-1, Q8_GROUP))
    scale = (g.abs().amax(-1) / 127.0).clamp_min(1e-8).half()
    codes = torch.round(g / scale.float()[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes.flatten(1), scale


def quantize_fp8_groups(w, group):
    """[N, K] float -> (e4m3 codes, fp16 scales [N, K // group]), absmax of each group -> 448."""
    g = w.float().unflatten(1, (-1, group))
    scale = (g.abs().amax(-1) / 448.0).clamp_min(1e-8).half()
    codes = (g / scale.float()[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes.flatten(1), scale


def dequantize(codes, scale):
    """Codes and scales of any encoding (scale None: plain) -> fp32 [N, K]."""
    if scale is None:
        return codes.float()
    if scale.dim() == 1:
        return codes.float() * scale.float()[:, None]
    return (codes.float().unflatten(1, (scale.shape[1], -1)) * scale.float()[..., None]).flatten(1)


def dequant_gemv_ref(x, codes, scale):
    """Torch reference: dequantise the whole matrix, fp32 matmul, cast to x's dtype."""
    return (x.float() @ dequantize(codes, scale).t()).to(x.dtype)


def gated_ref(x, gate, act):
    """`x · act(gate)` as two torch elementwise ops in x's dtype (act: "silu" or "sigmoid")."""
    return x * (F.silu(gate) if act == "silu" else torch.sigmoid(gate))


def gated(x, gate, act):
    """Dispatching `x · act(gate)`: one Triton launch on CUDA, `gated_ref` elsewhere."""
    return (gated_triton if use_triton(x) else gated_ref)(x, gate, act)


def _whole_k_rows(N, K, sms, accumulate, wide):
    """Several rows without an fp32 `out`, at K ≤ 2,048 (what was measured,
    bench/results/h100-verify-gemv-split.md): whole-K programs in one launch, where the split
    launch wrote fp32 partials that a reduce and a cast then summed; 16 rows a program at
    N ≤ 512, and (`wide`) 32 where those fill the SMs. None: the split launch."""
    if accumulate or K > 2048:
        return None
    if N <= 512:
        return dict(block_n=16, split=1)
    return dict(block_n=32, split=1) if wide and triton.cdiv(N, 32) >= sms else None


def engine_launch(B, N, K, codes, scale, sms=132, accumulate=False):
    """The launch the engine uses, from the H200 sweeps (bench/results/h200-fp8-gemv.md,
    h200-bf16-gemv.md).

    One row of e4m3 codes: the `fma` variant (no MMA over 15 zero rows; 1.1–1.5× the dot path
    row-scaled, 1.4–2× in groups of 32, 86–104 % of the copy bandwidth on the 27B's MLP and
    head), 32 rows a program where N fills the GPU, else 64 with K split over atomics.
    One row of plain bf16: `fma`, 16 rows a program, 512 K an iteration where N ≤ 8192 (else
    256; 32 rows and 128 K from N = 16384 to 65536 at K ≥ 5120), no K split (unless
    `accumulate`: adding into a caller's fp32 `out`, where the split is free): 1.01–1.13×
    cuBLAS on the 27B's GEMVs, 1.1–2.9× on the 35B-A3B's smaller ones; adding into `out` at
    N ≥ 5120, 256 K an iteration and about four waves of K splits. Several rows: the dot path
    (plain bf16 of N ≤ 512 without `out`: 16-row programs, no K split);
    group-scaled weights take at least 128 K a loop iteration (a 32-wide group alone left the
    loop latency-bound: 1.1–1.25× on the 27B shapes), 256 at one row where N ≥ 6144
    (bench/results/h200-q4-nibble-gemv.md, fp8_g64 rows). Adding into a caller's fp32 `out`
    (`accumulate`), one row of e4m3 codes takes 32-row programs and K splits for about four
    waves (bench/results/h200-gemv-splits.md)."""
    if scale is None:
        if B != 1:  # the MoE's router|score at a verify row's or a batch's rows (H100, N = 257
            # at K = 2,048: 7.4 -> 5.7 µs at 4 and 8 rows); larger bf16 in-projections go through
            # cuBLAS (`FusedLinear`), the 32-row rule was not measured for them
            return _whole_k_rows(N, K, sms, accumulate, wide=False) or {}
        kw = dict(fma=True, block_n=16, block_k=512 if N <= 8192 else 256, split=1)
        if 16384 <= N <= 65536 and K >= 5120 and not accumulate:  # the 27B's gate|up and
            # GDN in-projection: 32 rows a program, 128 K an iteration (h200-bf16-gemv.md's
            # best on both; the 27B's step 13.37 -> 13.13 ms, h200-27b-gemv-split.md). Not
            # measured at smaller K (the llama family's 1B and 8B): unchanged there
            kw.update(block_n=32, block_k=128)
        if accumulate:  # into `out`, a K split costs no zero fill or cast: it wins where N is
            # short (bench/results/h200-gemv-fusions.md: 35B-A3B gdn_out 7.9 -> 6.8 µs,
            # router 3.9 -> 2.5), and at the 27B's N = 5120 with 256 K an iteration over about
            # four waves (h200-gemv-splits.md, two leases: down 47.6 -> 43.0, 47.0 -> 44.1 µs)
            waves = sms
            if N >= 5120:
                kw["block_k"], waves = 256, 2 * sms
            kw["split"] = split_k(triton.cdiv(N, 16), K, min(kw["block_k"], K & -K), waves)
        return kw
    group = K // scale.shape[1] if scale.dim() == 2 else 0
    kw = {} if not group else {"group_k": min(max(group, 128), K & -K)}
    if codes.dtype != torch.float8_e4m3fn:  # int8 codes were not swept
        return kw
    if B != 1:  # several rows of fp8-row codes (a verify row, a batch; H100, K = 2,048 at 4
        # and 8 rows: the 35B-A3B's GDN in-projection N = 12,352 16.7 -> 11.5 µs and attention's
        # N = 9,216 14.8 -> 10.0 with 32-row programs; its router|score N = 257 7.7 -> 5.0 with
        # 16-row ones). Group scales were not measured: unchanged
        return (None if group else _whole_k_rows(N, K, sms, accumulate, wide=True)) or kw
    # into `out` 32-row programs over ~4 waves of K splits win at N = 5120 too
    # (bench/results/h200-gemv-splits.md: 27B fp8-group down 34.0 -> 27.8 µs)
    block_n = 32 if N >= 6144 or accumulate else 64
    if group and block_n == 32:  # h200-q4-nibble-gemv.md's fp8_g64 rows: 3-13 % over 128
        kw["group_k"] = min(max(group, 256), K & -K)
    blocks = triton.cdiv(N, block_n)
    kw.update(fma=True, block_n=block_n)
    if not group:
        kw["block_k"] = 256
    step = kw.get("group_k") or min(256, K & -K)
    if accumulate:
        kw.update(split=split_k(blocks, K, step, 2 * sms), atomic=True)
    elif blocks < sms:
        kw.update(split=split_k(blocks, K, step, sms), atomic=True)
    else:
        kw["split"] = 1
    return kw


def kernel_tiles(K, scale):
    """True when the kernel can tile K: its step (a group, else the largest power of two
    dividing K) is a power of two of at least 16, tl.dot's minimum. Every real model matrix
    qualifies; a tiny test model's K = 24 does not and takes the torch path."""
    step = K // scale.shape[1] if scale is not None and scale.dim() == 2 else K & -K
    return step >= 16 and step & (step - 1) == 0


def dequant_gemv(x, codes, scale, *, gate=None, act=None, out=None):
    """Dispatching entry point; see the module docstring (`gate`, `act`, `out`: the fusions
    of `dequant_gemv_triton`, done in torch on the reference path).

    The gated input fuses only into one row of a plain bf16 weight: on the H200
    (bench/results/h200-gemv-fusions.md, the 27B's down and o) it saves ~1.2 µs there against
    the gate as one Triton launch first (`gated`), which wins everywhere else (2 µs on the
    fp8-row down); recomputing the gate for every group-scaled tile or every 16-row dot tile
    costs 2-4× either. `out` wins on all."""
    N, K = codes.shape
    fuse_gate = x.shape[0] == 1 and scale is None
    if gate is not None and not (fuse_gate and use_triton(x) and kernel_tiles(K, scale)):
        x, gate = gated(x, gate, act), None
    if not use_triton(x) or not kernel_tiles(K, scale):
        if out is None:
            return dequant_gemv_ref(x, codes, scale)
        return out.add_(x.float() @ dequantize(codes, scale).t())
    launch = engine_launch(x.shape[0], N, K, codes, scale, accumulate=out is not None)
    return dequant_gemv_triton(x, codes, scale, gate=gate, act=act, out=out, **launch)
