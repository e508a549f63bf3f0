"""One-row GEMV `y = x Wᵀ` over 4-bit group codes read at half a byte a weight (Q4, §2.1).

The codes are repacked once at load into int32 words `[N, K // 8]`: within each group of 64
columns the 8 words i = 0..7 hold, in nibble j (bits 4j..4j+3), column j·8 + i as u = code + 8
(0..15). Scales stay one fp16 per group `[N, K // 64]`.

Why this layout: decoding a nibble with an int -> float conversion runs at a quarter of the
FP32 rate, which left the earlier nibble kernel ALU-bound at 20-35 % of the copy bandwidth
(bench/results/h200-q4-nibble-gemv.md). Here a nibble is masked straight into the mantissa of
an fp32 whose exponent is 0: `f = 1 + u · 2^(p - 23)` for the nibble moved to bit p. That takes
one shift and one mask-or (LOP3) a weight, `f · x'` one FMA, and the offset is folded once per
word column: with `x' = x · 2^(23 - p)` (exact), `Σ_j (u_j - 8) x_j = Σ_j f_j x'_j - Σ_j x'_j -
8 Σ_j x_j`, the last two sums taken per tile, not per row. x for nibble j is a contiguous run
of 8 columns per group, so its loads stay coalesced.

`pairs`: place nibbles at p = 16 and 12 alternately (w << 16, w << 8, w, w >> 8, w >> 16
serve two nibbles each), so 8 weights take 4 shifts and 8 LOP3 instead of 8 + 8; p = 12 keeps
16 bits for the code's product, above the bf16 output's 8.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP = 64
WORDS_PER_GROUP = GROUP // 8


def pack_nibble_words(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes `[N, K]` in [-8, 7] (K a multiple of 64) -> int32 words `[N, K // 8]`."""
    N, K = codes.shape
    assert K % GROUP == 0 and codes.dtype == torch.int8
    u = (codes.to(torch.int32) + 8).view(N, K // GROUP, 8, WORDS_PER_GROUP)  # [.., j, i]
    words = torch.zeros((N, K // GROUP, WORDS_PER_GROUP), dtype=torch.int32, device=codes.device)
    for j in range(8):
        words |= u[:, :, j, :] << (4 * j)  # bit 31 set by u_7 >= 8: int32 wraps, as wanted
    return words.view(N, K // 8)


def unpack_nibble_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_nibble_words`: int8 codes `[N, K]`."""
    N, W = words.shape
    w = words.view(N, W // WORDS_PER_GROUP, 1, WORDS_PER_GROUP)
    shifts = (4 * torch.arange(8, device=words.device, dtype=torch.int32)).view(1, 1, 8, 1)
    u = (w >> shifts) & 0xF
    return (u - 8).to(torch.int8).view(N, W * 8)


def nibble_gemv_ref(x, words, scale):
    """Torch reference: fp32 product of the dequantized weight, in x's dtype."""
    codes = unpack_nibble_words(words).float().unflatten(1, (-1, GROUP))
    w = (codes * scale.float()[..., None]).flatten(1)
    return (x.float() @ w.t()).to(x.dtype)


@triton.jit
def _nibble_term(w, x_ptrs, P: tl.constexpr, J4: tl.constexpr):
    """(f, x', x): the nibble at bit J4 of every word moved to mantissa bit P of an fp32 whose
    exponent is 0 (f = 1 + u 2^(P-23)), and x' = x 2^(23-P) for those columns."""
    if P > J4:
        t = w << (P - J4)
    elif P < J4:
        t = w >> (J4 - P)
    else:
        t = w
    f = ((t & (15 << P)) | 0x3F800000).to(tl.float32, bitcast=True)
    xj = tl.load(x_ptrs).to(tl.float32)
    return f, xj * (1 << (23 - P)), xj


@triton.jit
def _nibble_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, W, G, k_per_split,
                        BN: tl.constexpr, BG: tl.constexpr, PAIRS: tl.constexpr,
                        ATOMIC: tl.constexpr, STAGES: tl.constexpr):
    # W, G: words and groups a row, as arguments so that Triton sees them divisible by 16 and
    # vectorises the loads. Tiles are [rows, groups, 8 words]: x for nibble j is 8 contiguous
    # columns a group, and each (row, group) scale is loaded once
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    nmask = rows < N
    gi = tl.arange(0, BG)
    li = tl.arange(0, 8)
    r3 = rows[:, None, None]
    m3 = nmask[:, None, None]
    word = (gi * 8)[:, None] + li[None, :]  # [BG, 8]
    xcol = (gi * 64)[:, None] + li[None, :]
    acc = tl.zeros([BN, BG, 8], tl.float32)  # summed over groups and lanes at the end
    k0 = pid_k * k_per_split
    for k in tl.range(k0, k0 + k_per_split, BG * 64, num_stages=STAGES):
        w = tl.load(w_ptr + r3 * W + (k // 8 + word)[None, :, :], mask=m3, other=0)
        part = tl.zeros([BN, BG, 8], tl.float32)
        corr = tl.zeros([BG, 8], tl.float32)
        for j in tl.static_range(8):
            # nibble j to bit P of the mantissa: alternately 16 / 12 (PAIRS), else 19
            f, xs, xj = _nibble_term(w, x_ptr + k + xcol + j * 8,
                                     19 - PAIRS * (3 + 4 * (j % 2)), 4 * j)
            corr += xs + 8.0 * xj
            part += f * xs[None, :, :]
        sc = tl.load(s_ptr + rows[:, None] * G + (k // 64 + gi)[None, :], mask=nmask[:, None],
                     other=0.0).to(tl.float32)
        acc += (part - corr[None, :, :]) * sc[:, :, None]
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    if ATOMIC:
        tl.atomic_add(y_ptr + rows, y, mask=nmask, sem="relaxed")
    else:
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=nmask)


def nibble_gemv_triton(x, words, scale, *, block_n=32, block_g=4, split=1, pairs=True,
                       num_warps=4, num_stages=3, out=None):
    """x `[1, K]` bf16 -> `[1, N]` in x's dtype, or added into the fp32 `out` `[1, N]`.
    K per iteration is `block_g` groups of 64; each of `split` programs along K takes whole
    iterations."""
    B, K = x.shape
    N = words.shape[0]
    if B != 1:
        raise ValueError("the nibble GEMV is the batch-1 kernel")
    assert words.dtype == torch.int32 and words.shape[1] * 8 == K and scale.shape[1] * 64 == K
    assert K % (block_g * 64 * split) == 0
    x = x.contiguous()
    if out is not None:
        assert out.dtype == torch.float32 and out.shape == (1, N) and out.is_contiguous()
        y, atomic = out, True
    elif split > 1:
        y, atomic = torch.zeros((1, N), device=x.device, dtype=torch.float32), True
    else:
        y, atomic = torch.empty((1, N), device=x.device, dtype=x.dtype), False
    _nibble_gemv_kernel[(triton.cdiv(N, block_n), split)](
        x, words, scale, y, N, K // 8, K // 64, K // split, BN=block_n, BG=block_g,
        PAIRS=int(pairs), ATOMIC=int(atomic), STAGES=num_stages, num_warps=num_warps,
        num_stages=num_stages)
    if out is not None or not atomic:
        return y
    return y.to(x.dtype)
