"""Routed-expert matmul for batch-1 MoE decode: only the selected experts' weights are read.

`moe_gemv(x, w, ids)` computes `y[s] = x[s or 0] · w[ids[s]]ᵀ` for each of the k routing slots,
with w the stacked bf16 expert matrices `[E, N, K]` and ids `[k]` on the device (no host sync,
so a decode step stays graph-capturable). x is `[1, K]` (shared by all slots, the gate|up
projection) or `[k, K]` (one row per slot, the down projection). Returns `[k, N]` in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, use_triton


def moe_gemv_ref(x, w, ids):
    """Torch reference: gather the k expert matrices, fp32 batched matvec."""
    xs = x.float().expand(ids.shape[0], -1)
    return torch.einsum("sk,snk->sn", xs, w[ids].float()).to(x.dtype)


@triton.jit
def _moe_gemv_kernel(x_ptr, w_ptr, ids_ptr, y_ptr, N, K, x_stride,
                     DOT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     EVEN_K: tl.constexpr):
    s = tl.program_id(0)
    nb = tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    rows = nb * BN + tl.arange(0, BN)
    nmask = rows < N
    kk = tl.arange(0, BK)
    one = tl.arange(0, 16)
    acc = tl.zeros([16, BN], tl.float32)
    for k in range(0, K, BK):
        # one activation row padded to the 16 rows tl.dot needs
        xmask, wmask = (one == 0)[:, None], nmask[:, None]
        if not EVEN_K:  # a K tail (tiny test shapes); the real shapes keep the unmasked K
            xmask, wmask = xmask & (k + kk < K)[None, :], wmask & (k + kk < K)[None, :]
        x = tl.load(x_ptr + s * x_stride + (k + kk)[None, :] + one[:, None] * 0, mask=xmask,
                    other=0.0)
        w = tl.load(w_ptr + (e * N + rows[:, None]) * K + k + kk[None, :], mask=wmask,
                    other=0.0)
        acc += tl.dot(x.to(DOT), tl.trans(w.to(DOT)))
    out = tl.sum(acc, axis=0)  # rows 1..15 are zero
    tl.store(y_ptr + s * N + rows, out.to(y_ptr.dtype.element_ty), mask=nmask)


def moe_gemv_triton(x, w, ids, block_n=32, block_k=256):
    """Triton path: one program per (slot, block of N rows); a K tail is masked."""
    E, N, K = w.shape
    k = ids.shape[0]
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))  # small test matrices
    y = torch.empty(k, N, device=x.device, dtype=x.dtype)
    x = x.contiguous()
    _moe_gemv_kernel[(k, triton.cdiv(N, block_n))](
        x, w, ids, y, N, K, 0 if x.shape[0] == 1 else K, DOT=dot_dtype(), BN=block_n,
        BK=block_k, EVEN_K=K % block_k == 0, num_warps=4)
    return y


def moe_gemv(x, w, ids):
    """Dispatching entry point; see the module docstring."""
    return (moe_gemv_triton if use_triton(x) else moe_gemv_ref)(x, w, ids)
