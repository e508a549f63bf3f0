"""Batch-1..16 matmul `y = x Wᵀ` with quantised weights, dequantisation fused into the loads.

Weight encodings, kept as plain tensors:
* row-scaled: codes `[N, K]` (float8_e4m3fn, ninfer-format.md §2.3 fp8-row) and one scale per
  row `[N]`;
* group-scaled: codes `[N, K]` (int8, or float8_e4m3fn) and one scale per G consecutive K
  `[N, K // G]`, G a power of two ≥ 16: q8_g32 (§2.1's Q8 values), and the fp8 form the engine
  repacks Q4/Q5 groups into (their codes are exact in e4m3; `models.packed`).
x is `[B, K]` bf16, y `[B, N]` in x's dtype; accumulation is fp32. The Triton path tiles N,
splits K across programs when N alone cannot fill the GPU, and feeds bf16 tiles to `tl.dot`;
a group-scaled weight takes K tiles of exactly one group, so each tile's partial sums are
scaled by one value per row.

Variants of the Triton kernel, for the H200 sweep (bench/fp8_gemv_sweep.py); keyword arguments
of `dequant_gemv_triton`, defaults = the path above:
* `decode`: how a code tile becomes a dot operand. "f32": code -> fp32 -> bf16 (the default);
  "bf16": one conversion; "f16": code -> fp16 and an fp16 dot (x cast to fp16); "bits": fp16
  built from the code's bits with integer ops (e4m3: `((b & 0x7F) << 7) | ((b & 0x80) << 8)` is
  the value / 2^8, exact including subnormals, the 2^8 folded into the output; int8:
  `((b ^ 0x80) | 0x6400)` as fp16 is 1152 + code); "bits_asm": the e4m3 bit trick in inline
  PTX, four codes per 32-bit register (CUDA only: the interpreter runs no inline asm).
* `guard` (fp16 dots): each x row is scaled by a power of two, chosen on the device from its
  largest |x| over the program's K range, so that it fits fp16 (max 65504) whatever its range;
  undone on the fp32 accumulator. `guard=False` casts x as it is (inf above 65504).
  Why: products accumulate in fp32 and the codes fit fp16 (|e4m3| ≤ 448, the bit tricks
  ≤ 1.75), so only x can overflow. Inputs that leave an RMSNorm (q/k/v, gate/up, lm_head) are
  bounded, |x_i| ≤ sqrt(K)·max|γ| (72·max|γ| at K = 5120), but the down and o projections'
  inputs are not, and LLMs' "massive activations" sit exactly in down_proj inputs (hundreds
  to thousands; more in some models). The guard is exact (power-of-two scaling of bf16 values
  into [2^15, 2^16) loses nothing in fp16), needs no host sync and no extra launch (a pre-pass
  over the program's x slice, L2-resident, and one multiply per x element), and also keeps
  rows of tiny activations out of fp16's subnormals.
* `swap`: `tl.dot(w, xᵀ)` (the weight tile is the M = block_n operand) instead of
  `tl.dot(x, wᵀ)`.
* `fma` (B = 1 only): no `tl.dot`; fp32 products summed over each row of the tile (the loop
  is a `tl.range` with `num_stages`, so that Triton pipelines its loads without a dot).
* `atomic`: with a K split, partial sums `tl.atomic_add`-ed into a zeroed fp32 `[B, N]` instead
  of a `[split, B, N]` buffer summed by torch.
* `group_k` (group-scaled): K per loop iteration, a multiple of the group (default: one
  group); each group is still loaded, multiplied and scaled on its own.
* `split`: the K split (default `split_k`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, interpreting, use_triton

Q8_GROUP = 32
DECODES = ("f32", "bf16", "f16", "bits", "bits_asm")
F16_DOT = ("f16", "bits", "bits_asm")  # decodes whose tl.dot takes fp16 operands


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
    """Codes and scales of either encoding -> fp32 [N, K]."""
    if scale.dim() == 1:
        return codes.float() * scale.float()[:, None]
    return (codes.float().unflatten(1, (scale.shape[1], -1)) * scale.float()[..., None]).flatten(1)


def dequant_gemv_ref(x, codes, scale):
    """Torch reference: dequantise the whole matrix, fp32 matmul, cast to x's dtype."""
    return (x.float() @ dequantize(codes, scale).t()).to(x.dtype)


# e4m3 codes -> fp16 bit patterns worth code / 2^8, four codes (one 32-bit register) a call:
# prmt puts each code in the high byte of a 16-bit half (bytes 4..7 are $2's), then
# sign | ((rest >> 1) & exponent+mantissa). Integer pipe only, where the default conversion
# uses cvt.rn.f16x2.e4m3x2.
_E4M3_BITS_ASM = tl.constexpr("""{
.reg .b32 a, b;
prmt.b32 a, 0, $2, 0x5040;
prmt.b32 b, 0, $2, 0x7060;
shr.b32 $0, a, 1;
shr.b32 $1, b, 1;
and.b32 $0, $0, 0x3F803F80;
and.b32 $1, $1, 0x3F803F80;
and.b32 a, a, 0x80008000;
and.b32 b, b, 0x80008000;
or.b32 $0, $0, a;
or.b32 $1, $1, b;
}""")


@triton.jit
def _decode(w, DECODE: tl.constexpr, INT8: tl.constexpr, INTERP: tl.constexpr):
    """A loaded code tile as fp32 ("f32"), bf16 ("bf16") or fp16 (the others; the e4m3 bit
    tricks give value / 2^8). "bits"/"bits_asm" take the codes loaded as uint8."""
    if DECODE == "f32":
        out = w.to(tl.float32)
    elif DECODE == "bf16":
        if INT8 and INTERP:  # the interpreter's int -> bf16 keeps the integer's bits (3.9)
            out = w.to(tl.float32).to(tl.bfloat16)
        else:
            out = w.to(tl.bfloat16)
    elif DECODE == "f16":
        out = w.to(tl.float16)
    elif DECODE == "bits":
        b = w.to(tl.uint16)
        if INT8:  # 0x6400 | v is fp16 1024 + v, v = code + 128 in [1, 255]: exact
            out = ((b ^ 0x80) | 0x6400).to(tl.float16, bitcast=True) - 1152.0
        else:
            out = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(tl.float16, bitcast=True)
    else:
        out = tl.inline_asm_elementwise(_E4M3_BITS_ASM, "=r,=r,r", [w], dtype=tl.float16,
                                        is_pure=True, pack=4)
    return out


@triton.jit
def _tile_part(x_ptr, w_ptr, s_ptr, rows, bat, nmask, bmask, K, kg, kt, xscale,
               GROUPED: tl.constexpr, DOT: tl.constexpr, KT: tl.constexpr,
               DECODE: tl.constexpr, INT8: tl.constexpr, XGUARD: tl.constexpr,
               SWAP: tl.constexpr, FMA: tl.constexpr, INTERP: tl.constexpr):
    """Partial sums of K columns kg..kg+KT: [BN] (FMA), [BN, BB] (SWAP) or [BB, BN], times the
    group scale when group-scaled (the tile is one group)."""
    cols = kg + kt
    # no `other`: an integer fill cannot be cast to fp8, and masked rows are never stored
    w = _decode(tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=nmask[:, None]),
                DECODE, INT8, INTERP)
    if FMA:
        xv = tl.load(x_ptr + cols).to(tl.float32)
        part = tl.sum(w.to(tl.float32) * xv[None, :], axis=1)
    else:
        x = tl.load(x_ptr + bat[:, None] * K + cols[None, :], mask=bmask[:, None], other=0.0)
        if XGUARD:
            x = x.to(tl.float32) * xscale[:, None]
        if SWAP:
            part = tl.dot(w.to(DOT), tl.trans(x.to(DOT)))
        else:
            part = tl.dot(x.to(DOT), tl.trans(w.to(DOT)))
    if GROUPED:
        sc = tl.load(s_ptr + rows * (K // KT) + kg // KT, mask=nmask, other=0.0).to(tl.float32)
        if FMA:
            part = part * sc
        elif SWAP:
            part = part * sc[:, None]
        else:
            part = part * sc[None, :]
    return part


@triton.jit
def _dequant_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, B, N, K, k_per_split,
                         GROUPED: tl.constexpr, DOT: tl.constexpr, BB: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, KT: tl.constexpr,
                         DECODE: tl.constexpr, INT8: tl.constexpr, GUARD: tl.constexpr,
                         SWAP: tl.constexpr, FMA: tl.constexpr, ATOMIC: tl.constexpr,
                         INTERP: tl.constexpr, STAGES: tl.constexpr):
    # BK: K per loop iteration, KT: K per load / dot (one scale group; BK when row-scaled)
    NT: tl.constexpr = BK // KT
    BITS: tl.constexpr = (DECODE == "bits") or (DECODE == "bits_asm")
    F16: tl.constexpr = (DECODE == "f16") or BITS  # an fp16 dot (no chained and/or: Triton 3.6)
    UNSCALE: tl.constexpr = BITS and not INT8  # the e4m3 bit tricks give value / 2^8
    XGUARD: tl.constexpr = (F16 and GUARD) and not FMA
    nb = tl.program_id(0)
    sk = tl.program_id(1)
    rows = nb * BN + tl.arange(0, BN)
    bat = tl.arange(0, BB)
    kt = tl.arange(0, KT)
    nmask = rows < N
    bmask = bat < B
    k0 = sk * k_per_split
    if XGUARD:
        # per x row: 2^(15 - floor(log2 max|x|)) brings the row's max into [2^15, 2^16), below
        # fp16's 65504 (bf16 values there top out at 65280), by exponent arithmetic; an exponent
        # field clamped to >= 16 keeps both factors normal (a zero row: 2^126 and 2^-126)
        amax = tl.zeros([BB], tl.float32)
        for k in range(k0, k0 + k_per_split, KT):
            xg = tl.load(x_ptr + bat[:, None] * K + (k + kt)[None, :], mask=bmask[:, None],
                         other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(xg.to(tl.float32)), axis=1))
        e = tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF, 16)
        xscale = ((269 - e) << 23).to(tl.float32, bitcast=True)
        xunscale = ((e - 15) << 23).to(tl.float32, bitcast=True)
    else:
        xscale = tl.full([BB], 1.0, tl.float32)  # unused
    if FMA:
        acc = tl.zeros([BN], tl.float32)
    elif SWAP:
        acc = tl.zeros([BN, BB], tl.float32)
    else:
        acc = tl.zeros([BB, BN], tl.float32)
    if FMA:  # no dot to pipeline the loads for: ask for it (Triton pipelines this loop's loads)
        for k in tl.range(k0, k0 + k_per_split, BK, num_stages=STAGES):
            for t in tl.static_range(NT):
                acc += _tile_part(x_ptr, w_ptr, s_ptr, rows, bat, nmask, bmask, K, k + t * KT,
                                  kt, xscale, GROUPED, DOT, KT, DECODE, INT8, XGUARD, SWAP,
                                  FMA, INTERP)
    else:
        for k in range(k0, k0 + k_per_split, BK):
            for t in tl.static_range(NT):
                acc += _tile_part(x_ptr, w_ptr, s_ptr, rows, bat, nmask, bmask, K, k + t * KT,
                                  kt, xscale, GROUPED, DOT, KT, DECODE, INT8, XGUARD, SWAP,
                                  FMA, INTERP)
    if not GROUPED:
        sc = tl.load(s_ptr + rows, mask=nmask).to(tl.float32)
        if FMA:
            acc = acc * sc
        elif SWAP:
            acc = acc * sc[:, None]
        else:
            acc = acc * sc[None, :]
    if UNSCALE:
        acc = acc * 256.0
    if XGUARD:
        if SWAP:
            acc = acc * xunscale[None, :]
        else:
            acc = acc * xunscale[:, None]
    if FMA:  # B == 1
        out = y_ptr + sk * N + rows
        mask = nmask
    elif SWAP:
        out = y_ptr + (sk * B + bat[None, :]) * N + rows[:, None]
        mask = bmask[None, :] & nmask[:, None]
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
    if scale.dim() == 2:  # group-scaled: one group per load, group_k (or one group) per loop
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
                        *, decode="f32", guard=True, swap=False, fma=False, atomic=False,
                        group_k=None, split=None):
    """Triton path; K must be a multiple of `block_k` (true for every model matrix here), or of
    a smaller power of two of at least 16, which then replaces it. A group-scaled weight ignores
    `block_k` and takes `group_k` (default: one group) per loop iteration. The keyword-only
    arguments pick a kernel variant (module docstring); the defaults are the engine's path.

    The default tile won 3 of 4 shapes of the H200 sweep in bench/results/h200-kernels.json."""
    B, K = x.shape
    N = codes.shape[0]
    int8 = codes.dtype == torch.int8
    if decode not in DECODES:
        raise ValueError(f"decode {decode!r} not in {DECODES}")
    if decode == "bits_asm" and (int8 or interpreting()):
        raise ValueError("decode 'bits_asm' takes e4m3 codes on a CUDA device")
    if fma and B != 1:
        raise ValueError("fma is the batch-1 variant")
    block_k, kt = _tiles(K, scale, block_k, group_k)
    assert K % block_k == 0 and kt >= 16 and B <= 16
    n_blocks = triton.cdiv(N, block_n)
    if split is None:
        split = split_k(n_blocks, K, block_k)
    assert (K // block_k) % split == 0, "every split takes whole K iterations"
    atomic = atomic and split > 1
    if atomic:
        y = torch.zeros((B, N), device=x.device, dtype=torch.float32)
    else:
        y = torch.empty((split, B, N), device=x.device,
                        dtype=x.dtype if split == 1 else torch.float32)
    if decode in F16_DOT:
        dot = tl.float16
    else:  # bf16, or fp32 under the interpreter (its dot mishandles bf16: `dot_dtype`)
        dot = dot_dtype()
    w = codes.view(torch.uint8) if decode in ("bits", "bits_asm") else codes
    _dequant_gemv_kernel[(n_blocks, split)](
        x.contiguous(), w, scale, y, B, N, K, K // split, GROUPED=scale.dim() == 2,
        DOT=dot, BB=16, BN=block_n, BK=block_k, KT=kt, DECODE=decode, INT8=int8,
        GUARD=guard, SWAP=swap, FMA=fma, ATOMIC=atomic, INTERP=interpreting(),
        STAGES=num_stages,
        num_warps=num_warps, num_stages=num_stages)
    if atomic:
        return y.to(x.dtype)
    return y[0] if split == 1 else y.sum(0).to(x.dtype)


def engine_launch(B, N, K, codes, scale, sms=132):
    """The launch the engine uses, from the H200 sweep (bench/results/h200-fp8-gemv.md).

    One row of e4m3 codes: the `fma` variant (no MMA over 15 zero rows; 1.1–1.5× the dot path
    row-scaled, 1.4–2× in groups of 32, 86–104 % of the copy bandwidth on the 27B's MLP and
    head), 32 rows a program where N fills the GPU, else 64 with K split over atomics.
    Several rows: the dot path; group-scaled weights take at least 128 K a loop iteration (a
    32-wide group alone left the loop latency-bound: 1.1–1.25× on the 27B shapes)."""
    group = K // scale.shape[1] if scale.dim() == 2 else 0
    kw = {} if not group else {"group_k": min(max(group, 128), K & -K)}
    if B != 1 or codes.dtype != torch.float8_e4m3fn:  # int8 codes were not swept
        return kw
    block_n = 32 if N >= 6144 else 64
    blocks = triton.cdiv(N, block_n)
    kw.update(fma=True, block_n=block_n)
    if not group:
        kw["block_k"] = 256
    if blocks < sms:
        step = kw.get("group_k") or min(256, K & -K)
        kw.update(split=split_k(blocks, K, step, sms), atomic=True)
    else:
        kw["split"] = 1
    return kw


def dequant_gemv(x, codes, scale):
    """Dispatching entry point; see the module docstring."""
    if not use_triton(x):
        return dequant_gemv_ref(x, codes, scale)
    return dequant_gemv_triton(x, codes, scale, **engine_launch(x.shape[0], *codes.shape,
                                                                codes, scale))
