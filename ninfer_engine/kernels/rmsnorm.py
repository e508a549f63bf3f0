"""RMSNorm with an optional fused residual add, plain `x̂·w` or zero-centred `x̂·(1+w)`.

`rms_norm(x, w, eps, residual=None, zero_centred=False)` returns `(y, h)` where
`h = x + residual` (or `x` when no residual is given) and `y = norm(h)`; the decoder keeps `h`
as the new residual stream. Statistics are fp32; `h` and `y` are rounded to the residual's dtype
(x's without one), and the zero-centred form rounds like HF's Qwen3NextRMSNorm (fp32 product,
then one cast). x may be an fp32 delta beside a bf16 residual: a projection's fp32 sums
(`dequant_gemv`'s `out`), added unrounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton
from .pdl import pdl_launch, pdl_release, pdl_wait


def rms_norm_ref(x, w, eps, residual=None, zero_centred=False):
    """Torch reference over the last dim of x [..., H]."""
    h = x if residual is None else (x.float() + residual.float()).to(residual.dtype)
    hf = h.float()
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    wf = w.float() + 1.0 if zero_centred else w.float()
    return (hf * wf).to(h.dtype), h


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, H, eps,
                     HAS_RES: tl.constexpr, ZERO_CENTRED: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    x = tl.load(x_ptr + row * H + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * H + offs, mask=mask, other=0.0)
        # round the sum to the activation dtype, as the unfused path stores it
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * H + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTRED:
        w = w + 1.0
    tl.store(y_ptr + row * H + offs, (xf * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(x, w, eps, residual=None, zero_centred=False):
    """Triton path: one program per row, the whole row in registers."""
    H = x.shape[-1]
    x2 = x.contiguous().view(-1, H)
    if residual is None:
        h, r = x, x2
    else:
        r = residual.contiguous().view(-1, H)
        h = torch.empty_like(r)
    y = torch.empty_like(x2, dtype=h.dtype)
    block = triton.next_power_of_2(H)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r, w, y, h if residual is not None else y, H, eps,
        HAS_RES=residual is not None, ZERO_CENTRED=zero_centred, BLOCK=block,
        num_warps=min(16, max(1, block // 512)), **pdl_launch(x2))
    return y.view(x.shape), h.view(x.shape)


def rms_norm(x, w, eps, residual=None, zero_centred=False):
    """Dispatching entry point; see the module docstring."""
    fn = rms_norm_triton if use_triton(x) else rms_norm_ref
    return fn(x, w, eps, residual, zero_centred)
