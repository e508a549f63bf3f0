"""Activations as e4m3 codes with one power-of-two scale a row, for the prompt step's fp8 × fp8
GEMMs (`moe_grouped`'s `fp8_act`).

`quantize_rows(x)` -> (codes [R, C] float8_e4m3fn, scale [R] fp32): a row's scale is the least
power of two 2ᵏ with amax · 2⁻ᵏ ≤ 448 (e4m3's largest finite value), its codes x · 2⁻ᵏ rounded to
nearest even, so code · scale is x within half a code step: 2⁻⁴ of |x| in e4m3's normal range,
2⁻¹⁰ · scale below it. A power of two makes the scaling exact: the codes depend on the cast's
rounding alone, so the kernel, its torch reference and any GPU agree bit for bit (a divided
scale does not: torch's `448 / amax` is a reciprocal times 448, one ulp from Triton's
quotient). It costs at most one binade at the bottom of the range (the largest code lands in
[224, 448]). An all-zero row gets codes 0 and a tiny scale. One Triton program a row (the row
in registers: C ≤ `MAX_COLUMNS`); `quantize_rows_ref` is the same arithmetic in torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import interpreting

MAX_COLUMNS = 16384
# shared by the kernel and its reference
_TINY = tl.constexpr(2.0 ** -100)  # the amax of an all-zero row: finite scales, codes 0
_MANTISSA_1_75 = tl.constexpr(0x600000)  # fp32 mantissa bits of 1.75: 448 is 1.75 · 2⁸


@triton.jit
def _round_e4m3(v):
    """v (|v| ≤ 448, fp32) rounded to nearest even on e4m3's grid, by hand: a GPU's cast does
    that (cvt.rn), the interpreter's (Triton 3.9) can land binades away (-124.6 -> -64), so
    there the kernel casts values already on the grid. Steps: 2^(e-3) in binade e ≥ -6, 2⁻⁹
    below; adding and taking away 1.5·2²³ rounds v / step to an integer (|v / step| ≤ 16)."""
    e = ((v.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    step = ((tl.maximum(e, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)
    return ((v / step + 12582912.0) - 12582912.0) * step


@triton.jit
def _quant_rows_kernel(x_ptr, codes_ptr, scale_ptr, C, stride, BLOCK: tl.constexpr,
                       MANUAL_RNE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), _TINY)
    bits = amax.to(tl.int32, bitcast=True)
    # amax = m · 2^e, m in [1, 2): the least k with amax · 2^-k ≤ 1.75 · 2^8
    k = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > _MANTISSA_1_75).to(tl.int32)
    q = x * ((127 - k) << 23).to(tl.float32, bitcast=True)
    if MANUAL_RNE:
        q = _round_e4m3(q)
    tl.store(codes_ptr + row * C + cols, q.to(codes_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, ((127 + k) << 23).to(tl.float32, bitcast=True))


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `quantize_rows` (the same operations)."""
    xf = x.float()
    bits = xf.abs().amax(-1).clamp_min(_TINY.value).view(torch.int32)
    k = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > _MANTISSA_1_75.value).int()
    q = xf * ((127 - k) << 23).view(torch.float32)[:, None]
    return q.to(torch.float8_e4m3fn), ((127 + k) << 23).view(torch.float32)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See the module docstring. x [R, C], its last dim contiguous."""
    R, C = x.shape
    assert C <= MAX_COLUMNS and x.stride(-1) == 1, (x.shape, x.stride())
    codes = torch.empty(R, C, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(R, dtype=torch.float32, device=x.device)
    if R:
        _quant_rows_kernel[(R,)](x, codes, scale, C, x.stride(0),
                                 BLOCK=triton.next_power_of_2(C), MANUAL_RNE=interpreting(),
                                 num_warps=4)
    return codes, scale
