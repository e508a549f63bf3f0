"""NeoX split-half partial rotary embedding (model-math.md §2.2).

Dims `[0, rd)` of each head rotate (dim i pairs with i + rd/2, frequency θ^(-2i/rd)); dims
`[rd, D)` pass through. Angles and products are fp32, the result is cast to x's dtype.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton


def rope_ref(x, positions, rd, theta):
    """x [T, heads, D], positions [T] int -> rotated copy of x."""
    half = rd // 2
    # fp32 angles like the model's PartialRope, so both paths round the same way
    ang = positions.float()[:, None] * inv_freq(rd, theta, x.device)  # [T, rd/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    xf = x.float()
    a, b = xf[..., :half], xf[..., half:rd]
    out = xf.clone()
    out[..., :half] = a * cos - b * sin
    out[..., half:rd] = b * cos + a * sin
    return out.to(x.dtype)


@triton.jit
def _rope_kernel(x_ptr, y_ptr, pos_ptr, inv_ptr, heads, D, HALF: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    base = (t * heads + h) * D
    pos = tl.load(pos_ptr + t).to(tl.float32)
    i = tl.arange(0, HALF)
    ang = pos * tl.load(inv_ptr + i)
    c, s = tl.cos(ang), tl.sin(ang)
    a = tl.load(x_ptr + base + i).to(tl.float32)
    b = tl.load(x_ptr + base + HALF + i).to(tl.float32)
    tl.store(y_ptr + base + i, (a * c - b * s).to(y_ptr.dtype.element_ty))
    tl.store(y_ptr + base + HALF + i, (b * c + a * s).to(y_ptr.dtype.element_ty))
    d = 2 * HALF + tl.arange(0, BLOCK_D)
    rest = d < D
    tl.store(y_ptr + base + d, tl.load(x_ptr + base + d, mask=rest), mask=rest)


@functools.lru_cache(maxsize=16)
def inv_freq(rd, theta, device):
    """fp32 frequencies θ^(-2i/rd), computed in fp64 so both paths share the same table.

    Cached per device: a fresh host-to-device copy would break CUDA graph capture."""
    i = torch.arange(rd // 2, dtype=torch.float64)
    return (theta ** (-i * 2 / rd)).float().to(device)


def rope_triton(x, positions, rd, theta):
    """Triton path: one program per (token, head)."""
    T, heads, D = x.shape
    x = x.contiguous()
    y = torch.empty_like(x)
    block_d = max(triton.next_power_of_2(D - rd), 1)
    _rope_kernel[(T, heads)](x, y, positions, inv_freq(rd, theta, x.device), heads, D,
                             HALF=rd // 2, BLOCK_D=block_d)
    return y


def rope(x, positions, rd, theta):
    """Dispatching entry point; see the module docstring."""
    return (rope_triton if use_triton(x) else rope_ref)(x, positions, rd, theta)
