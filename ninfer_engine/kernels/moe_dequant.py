"""Stacked fp8 routed experts back to bf16: the torch reference, and prefill's routed-only kernel.

A stack is `w [E, N, K]`: bf16 weights (scale None), or e4m3 codes with one scale a row
(`scale [E, N]`, fp8-row) or one a G-column group (`scale [E, N, K // G]`, the exact e4m3 form
of Q4/Q5 groups); scales in any float dtype, applied in fp32 (`scale_layout`).

`dequantize_experts(w, scale, ids=None, dtype)`
    torch: every expert, or `w[ids]`, as `dtype` (the decode kernels' reference).

`dequantize_routed(w, scale, counts, out)`
    `out[e] = dequantized expert e` for every e with `counts[e] > 0`; the other experts of
    `out` are left as they are. The prefill chunk's grouped matmul reads only the experts its
    rows route to, so only those are decoded: one launch over (expert, block) programs whose
    loads and stores are masked off for unrouted experts (no traffic), and no host sync (the
    counts stay on the device). 1 byte read and 2 written a weight of a routed expert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton


def scale_layout(w, scale):
    """(mode, G, groups per row) of stack `w`: mode 0 for bf16 (scale None), 1 for one scale a
    row, 2 for one a G-column group (G a power of two)."""
    if scale is None:
        return 0, 1, 1
    assert w.dtype == torch.float8_e4m3fn and scale.shape[:2] == w.shape[:2], (
        w.dtype, w.shape, scale.shape)
    if scale.dim() == 2:
        return 1, 1, 1
    groups = scale.shape[2]
    G = w.shape[2] // groups
    assert G * groups == w.shape[2] and G & (G - 1) == 0, (w.shape, scale.shape)
    return 2, G, groups


def dequantize_experts(w, scale, ids=None, dtype=torch.float32):
    """Stacked experts (all, or `w[ids]`) as `dtype`: codes times their row or group scales in
    fp32; bf16 weights (scale None) only cast."""
    w = w if ids is None else w[ids]
    if scale is None:
        return w.to(dtype)
    s = (scale if ids is None else scale[ids]).float()
    if s.dim() == w.dim() - 1:  # one scale a row
        return (w.float() * s[..., None]).to(dtype)
    return (w.float().unflatten(-1, (s.shape[-1], -1)) * s[..., None]).flatten(-2).to(dtype)


def dequantize_routed_ref(w, scale, counts, out):
    """Torch path (one host sync: the routed experts' ids)."""
    used = torch.nonzero(counts).flatten()
    if used.numel():
        out[used] = dequantize_experts(w, scale, used, out.dtype)
    return out


@triton.jit
def _dequant_routed_kernel(w_ptr, s_ptr, counts_ptr, out_ptr, NK, S_PER, DIV,
                           BLOCK: tl.constexpr):
    e = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    # an unrouted expert's program masks everything off: no memory traffic
    limit = tl.where(tl.load(counts_ptr + e) > 0, NK, 0)
    mask = offs < limit
    base = e.to(tl.int64) * NK
    w = tl.load(w_ptr + base + offs, mask=mask).to(tl.float32)
    # the flat index of [N, K] over DIV = K (row scales) or G (group scales: [N, K // G])
    s = tl.load(s_ptr + e.to(tl.int64) * S_PER + offs // DIV, mask=mask, other=0.0)
    w = tl.where(mask, w * s.to(tl.float32), 0.0)
    tl.store(out_ptr + base + offs, w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_routed_triton(w, scale, counts, out, block=4096, num_warps=8):
    """Triton path: one program per (expert, `block` weights)."""
    mode, G, groups = scale_layout(w, scale)
    assert mode > 0 and out.shape == w.shape and out.is_contiguous() and w.is_contiguous()
    E, N, K = w.shape
    _dequant_routed_kernel[(E, triton.cdiv(N * K, block))](
        w, scale.contiguous(), counts, out, N * K, scale[0].numel(), K if mode == 1 else G,
        BLOCK=block, num_warps=num_warps)
    return out


def dequantize_routed(w, scale, counts, out):
    """Dispatching entry point; see the module docstring."""
    fn = dequantize_routed_triton if use_triton(w) else dequantize_routed_ref
    return fn(w, scale, counts, out)
