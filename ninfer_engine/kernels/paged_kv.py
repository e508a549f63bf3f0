"""The KV page formats the paged-attention kernels read in place, and their shared tile loader.

One of K or V of a paged pool is a bare tensor of plain rows, or the tuple of its `codecs.kv`
codec's components as page views `[num_pages, PAGE=64, nkv, ...]` (`KvStorage.page_view`); K and
V each carry their own format (k8v4). `kv_operand` turns one into the kernels' arguments (three
pointers, a format and a group size as constexprs) and `_load_kv` returns one page's `[PAGE, D]`
tile of one KV head in the dot dtype, dequantised in registers:

| format   | components (last dim)                          | `--kv-dtype`        | value         |
|----------|------------------------------------------------|---------------------|---------------|
| `PLAIN`  | rows (D): bf16, fp16 or fp32                   | bf16                | row           |
| `INT8`   | int8 codes (D), fp16 scales (D / G)            | int8, k8v4's K      | code · scale  |
| `FP8`    | e4m3 codes (D), fp32 scale per vector (1)      | fp8                 | code · scale  |
| `INT4`   | nibbles (D / 2), fp16 scales (D / 16)          | k8v4's V            | (c − 8) · sc  |
| `NVFP4`  | E2M1 (D / 2), e4m3 (D / 16), fp32 per vector   | nvfp4               | c · sc · vec  |

int8 groups are G = 32 values (or D); fp8's per-vector scale is one group of G = D (any G
dividing D works for both). Nibbles pack two values a byte, the even index in the low nibble.
fp8's e4m3 codes come as a uint8 view and load as bytes (a masked slot reads a zero byte: the
interpreter cannot make a `float8e4nv` constant), then bitcast to `float8e4nv` and convert in
hardware (Hopper and newer; the interpreter emulates it). nvfp4 decodes by bit placement, as
`kernels.quant_gemv` does (E2M1 has no conversion on Hopper): E2M1 bits become fp16 bits worth
`e2m1 · 2^-14`, the (non-negative) e4m3 block scale's exponent and mantissa fp16 bits worth
`e4m3 · 2^-8`, and the 2^22 rides on the vector scale.

Known limit: with Triton 3.6 on an H200 the decode kernel returns wrong results for a nibble K
(`INT4`, `NVFP4`) at head dim 16 (D ≥ 32 is right, prefill and a nibble V are right at 16; the
tile itself loads right): `KvStorage.kernel_layout` keeps such pools on the gather path.

`gather_kv` is the torch references' read: whole pages through the codecs' `decode`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..codecs.kv import Fp8Codec, Int4Codec, Int8Codec, Nvfp4Codec, as_bits

PAGE = 64
PLAIN = tl.constexpr(0)
INT8 = tl.constexpr(1)
FP8 = tl.constexpr(2)
INT4 = tl.constexpr(3)
NVFP4 = tl.constexpr(4)


def _parts(kv, scale=None) -> tuple:
    """One of K or V as its components: a tuple as given, or `kv` with the int8 `scale` of the
    (codes, scales) pair form (`paged_attention.quantize_kv_int8`)."""
    if isinstance(kv, (tuple, list)):
        assert scale is None, "a component tuple already holds its scales"
        return tuple(kv)
    return (kv,) if scale is None else (kv, scale)


def kv_operand(kv, scale=None) -> tuple:
    """(codes, scale, vector, FMT, G, D) of one of K or V: the three pointers `_load_kv` reads
    (unused ones repeat the codes), its format, group size and head dim."""
    codes, *scales = _parts(kv, scale)
    if not scales:
        assert codes.is_floating_point() and codes.element_size() > 1, codes.dtype
        D = codes.shape[-1]
        return codes, codes, codes, PLAIN.value, D, D
    if codes.dtype in (torch.int8, torch.float8_e4m3fn):
        (sc,) = scales
        D = codes.shape[-1]
        fmt = INT8 if codes.dtype == torch.int8 else FP8
        return as_bits(codes), sc, codes, fmt.value, D // sc.shape[-1], D
    assert codes.dtype == torch.uint8, codes.dtype
    D = 2 * codes.shape[-1]
    if len(scales) == 1:
        assert scales[0].dtype == torch.float16
        return codes, scales[0], codes, INT4.value, D // scales[0].shape[-1], D
    block, vector = scales
    assert block.dtype == torch.float8_e4m3fn and vector.shape[-1] == 1
    return codes, as_bits(block), vector, NVFP4.value, D // block.shape[-1], D


def gather_kv(kv, scale, pages: torch.Tensor, L: int) -> torch.Tensor:
    """Tokens 0 .. L-1 held by `pages` [p] (int64) of one of K or V -> fp32 [L, nkv, D],
    decoded by the codec of its format."""
    parts = _parts(kv, scale)
    rows = tuple(as_bits(p)[pages].flatten(0, 1)[:L].view(p.dtype) for p in parts)
    _, _, _, fmt, _, _ = kv_operand(parts)
    if fmt == PLAIN.value:
        return rows[0].float()
    codec = {INT8.value: Int8Codec, FP8.value: Fp8Codec, INT4.value: Int4Codec,
             NVFP4.value: Nvfp4Codec}[fmt]()
    return codec.decode(rows, torch.float32)


@triton.jit
def _softmax_step(s, m, l):
    """One page of an online-softmax (flash) attention: masked scores s `[M, PAGE]` in log2
    units -> the new row max and denominator, the page's weights p and the factor alpha the
    running output is rescaled by (`acc * alpha + p @ v`, left to the caller so that the V
    tile loads after the scores, as before). A row that sees none of its keys yet (all
    masked: a split of a prefill chunk's pages above its causal diagonal) keeps max -inf, and
    the shift by 0 keeps its weights and rescale 0, not NaN."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - shift)
    p = tl.exp2(s - shift[:, None])
    return m_new, l * alpha + tl.sum(p, axis=1), p, alpha


@triton.jit
def _load_kv(codes_ptr, scale_ptr, vec_ptr, page, tok, kvh, tok_mask, NKV: tl.constexpr,
             D: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr, DOT: tl.constexpr):
    """One page's [PAGE, D] tile of head kvh in the dot dtype (see the module docstring);
    tokens outside `tok_mask` are never read and come back as zeros."""
    row = (page * 64 + tok) * NKV + kvh  # [PAGE] head vectors
    grp = tl.arange(0, D // G)
    if FMT == PLAIN:
        d = tl.arange(0, D)
        x = tl.load(codes_ptr + row[:, None] * D + d[None, :], mask=tok_mask[:, None], other=0)
        tile = x.to(DOT)
    elif FMT == INT8 or FMT == FP8:
        # [PAGE, D/G, G] codes times their [PAGE, D/G] group scales, then flattened back
        off = row[:, None, None] * D + grp[None, :, None] * G + tl.arange(0, G)[None, None, :]
        x3 = tl.load(codes_ptr + off, mask=tok_mask[:, None, None], other=0)
        if FMT == FP8:
            x3 = x3.to(tl.float8e4nv, bitcast=True)
        x3 = x3.to(tl.float32)
        sc = tl.load(scale_ptr + row[:, None] * (D // G) + grp[None, :], mask=tok_mask[:, None],
                     other=0)
        tile = tl.reshape(x3 * sc.to(tl.float32)[:, :, None], [64, D]).to(DOT)
    else:
        # [PAGE, D/G, G/2] bytes -> [PAGE, D/G, G] nibbles, low nibble first
        off = (row[:, None, None] * (D // 2) + grp[None, :, None] * (G // 2)
               + tl.arange(0, G // 2)[None, None, :])
        b = tl.load(codes_ptr + off, mask=tok_mask[:, None, None], other=0)
        nib = tl.reshape(tl.join(b & 15, b >> 4), [64, D // G, G])
        sc = tl.load(scale_ptr + row[:, None] * (D // G) + grp[None, :], mask=tok_mask[:, None],
                     other=0)
        if FMT == INT4:
            x3 = nib.to(tl.float32) - 8.0
            sc = sc.to(tl.float32)
        else:  # NVFP4: E2M1 as fp16 bits worth 2^-14 of it (sign to bit 15, e, m to 11..9),
            # the e4m3 block scales (≥ 0) as fp16 bits worth 2^-8 of them (e, m to 13..7)
            h = ((nib & 8).to(tl.uint16) << 12) | ((nib & 7).to(tl.uint16) << 9)
            x3 = h.to(tl.float16, bitcast=True).to(tl.float32)
            sb = (sc.to(tl.uint16) & 0x7F) << 7
            vec = tl.load(vec_ptr + row, mask=tok_mask, other=0)
            sc = sb.to(tl.float16, bitcast=True).to(tl.float32) * (vec * 4194304.0)[:, None]
        tile = tl.reshape(x3 * sc[:, :, None], [64, D]).to(DOT)
    return tile
