"""`slot_sum(slots, residual=None)`: a prompt step's MoE output, each token's expert slots summed,
plus the block's residual where given, in one pass.

`slots` [T, k, H] bf16 holds token t's k weighted expert outputs (`moe_grouped.moe_grouped_down`
writes them in (token, slot) order); the result [T, H] bf16 is `residual[t] + Σ_j slots[t, j]`,
summed in fp32 in that order (residual first, then slot 0, 1, …) and rounded once. The torch
reference sums in the same order, so the two agree bit for bit.

Before, torch's reduction summed the slots (on the H100, 133 µs a layer of the 8 × 955-token
35B-A3B prompt step: ~281 MB read at ~2.1 TB/s) and the block added the residual in a second
pass over [T, H]; this pass takes 120 µs with the residual (~2.9 TB/s;
bench/results/h100-prompt-step-gdn-bf16-slot-sum.md).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton
from .gdn_fused_kernels import _round_bf16


@triton.jit(do_not_specialize=["T"])
def _slot_sum_kernel(s_ptr, r_ptr, out_ptr, T, H: tl.constexpr, K: tl.constexpr,
                     BT: tl.constexpr, BH: tl.constexpr, RESIDUAL: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    m = (t < T)[:, None] & (h < H)[None, :]
    if RESIDUAL:
        acc = tl.load(r_ptr + t[:, None] * H + h[None, :], mask=m, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros((BT, BH), dtype=tl.float32)
    for j in tl.static_range(K):
        acc += tl.load(s_ptr + (t[:, None] * K + j) * H + h[None, :], mask=m,
                       other=0.0).to(tl.float32)
    # rounded to the nearest (the interpreter's cast truncates)
    tl.store(out_ptr + t[:, None] * H + h[None, :], _round_bf16(acc).to(tl.bfloat16), mask=m)


def slot_sum_ref(slots: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference (see the module docstring)."""
    acc = (torch.zeros(slots[:, 0].shape, dtype=torch.float32, device=slots.device)
           if residual is None else residual.float())
    for j in range(slots.shape[1]):
        acc = acc + slots[:, j].float()
    return acc.to(slots.dtype)


def slot_sum_triton(slots: torch.Tensor, residual: torch.Tensor | None = None,
                    block_t: int = 4) -> torch.Tensor:
    """Triton path, one launch: grid (⌈T / block_t⌉, ⌈H / BH⌉)."""
    T, K, H = slots.shape
    assert slots.dtype == torch.bfloat16 and slots.is_contiguous()
    assert residual is None or (residual.shape == (T, H) and residual.is_contiguous()
                                and residual.dtype == torch.bfloat16)
    assert slots.numel() < 2**31, "int32 offsets"
    out = torch.empty(T, H, dtype=slots.dtype, device=slots.device)
    bh = min(1024, triton.next_power_of_2(H))
    if T:
        _slot_sum_kernel[(triton.cdiv(T, block_t), triton.cdiv(H, bh))](
            slots, slots if residual is None else residual, out, T, H=H, K=K, BT=block_t,
            BH=bh, RESIDUAL=residual is not None, num_warps=4)
    return out


def slot_sum(slots: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Dispatching entry point; see the module docstring."""
    bf16 = slots.dtype == torch.bfloat16 and (residual is None
                                              or residual.dtype == torch.bfloat16)
    if use_triton(slots) and bf16:
        return slot_sum_triton(slots.contiguous(),
                               None if residual is None else residual.contiguous())
    return slot_sum_ref(slots, residual)
