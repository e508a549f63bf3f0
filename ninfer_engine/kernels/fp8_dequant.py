"""e4m3 weight codes times their row or group scales, written once in the activation dtype.

`fp8_dequant(codes, scale, dtype, out=None)`: codes `[N, K]` float8_e4m3fn, scale `[N]` (one
per row: fp8-row) or `[N, K // G]` (one per G consecutive K: the fp8 groups Q4/Q5 repack into),
any float dtype → `[N, K]` in `dtype` (into `out` when given: a row block of a larger matrix,
rows contiguous). The product is taken in fp32 and rounded once, as `models.packed`'s torch
path does; e4m3 values are exact in bf16, fp16 and fp32.

A prefill chunk over packed fp8 weights pays this per projection before cuBLAS: one pass that
reads a byte and writes two per weight. The torch path (`codes.to(dtype)`, then a mixed-dtype
multiply) made three passes and ran the multiply through a slow broadcasting kernel: the 27B's
fp8-row prefill was 3.2 K tok/s against bf16's 6.9 K (bench/results/h200-ninfer-bench-27b-fp8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton


@triton.jit
def _fp8_dequant_kernel(c_ptr, s_ptr, o_ptr, N, K, s_stride, GROUP: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    offs = rows[:, None] * K + cols[None, :]
    w = tl.load(c_ptr + offs, mask=mask).to(tl.float32)
    if GROUP == 0:  # one scale per row
        sc = tl.load(s_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[:, None]
    else:
        sc = tl.load(s_ptr + rows[:, None] * s_stride + cols[None, :] // GROUP, mask=mask,
                     other=0.0).to(tl.float32)
    tl.store(o_ptr + offs, (w * sc).to(o_ptr.dtype.element_ty), mask=mask)


def fp8_dequant_ref(codes, scale, dtype, out=None):
    """Torch path: one multiply that computes in fp32 and writes `dtype` (no fp32 copy of the
    matrix)."""
    n, k = codes.shape
    out = torch.empty(n, k, dtype=dtype, device=codes.device) if out is None else out
    c = codes.to(dtype)
    if scale.dim() == 1:
        torch.mul(c, scale.float()[:, None], out=out)
    else:
        g = scale.shape[1]
        torch.mul(c.view(n, g, -1), scale.float()[..., None], out=out.view(n, g, -1))
    return out


def fp8_dequant(codes, scale, dtype, out=None, block_n: int = 16, block_k: int = 512):
    """Triton on CUDA (or under the interpreter), else `fp8_dequant_ref`."""
    if not use_triton(codes):
        return fp8_dequant_ref(codes, scale, dtype, out)
    n, k = codes.shape
    if out is None:
        out = torch.empty(n, k, dtype=dtype, device=codes.device)
    assert out.shape == (n, k) and out.stride() == (k, 1), "out: contiguous rows"
    group = 0 if scale.dim() == 1 else k // scale.shape[1]
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _fp8_dequant_kernel[grid](codes, scale, out, n, k, scale.stride(0), GROUP=group,
                              BN=block_n, BK=block_k, num_warps=4)
    return out
