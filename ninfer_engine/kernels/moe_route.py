"""Routed-expert top-k: `route_topk(logits, k, renormalise)` in one launch.

logits `[B, E]` (bf16 or fp32, E ≤ 512) → `(weights [B, k] fp32, ids [B, k] int64)`, equal to
`w, ids = topk(softmax(logits.float(), -1), k)` (descending, as torch.topk), then
`w / w.sum(-1, keepdim=True)` when `renormalise`. One program per row (one warp): softmax in
fp32 registers, then k max-reductions over packed (probability bits, index) keys (k ≤ 16).
`shared=True` (the shared expert folded into the expert stack as expert E, `models.experts`):
logits `[B, E + 1]` whose last column is the shared-expert score; the outputs get a slot k
holding `(sigmoid(score), E)`, so the routed kernels run the shared expert as one more slot.
Equal probabilities (bf16 logits do tie, e.g. 3 equal logits of 256 at the 8th slot) come out
lowest index first; torch.topk's order among ties is unspecified (CPU and CUDA differ). The
ids stay on the device (no host sync), so a decode step remains graph-capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton
from .pdl import pdl_launch, pdl_release, pdl_wait


def route_topk_ref(logits, k, renormalise, shared=False):
    """Torch reference: the sequence of `SparseMoE.route` (plus the shared slot)."""
    scores = logits[:, :-1] if shared else logits
    probs = torch.softmax(scores.float(), -1)
    weights, ids = torch.topk(probs, k, -1)
    if renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    if shared:
        weights = torch.cat([weights, torch.sigmoid(logits[:, -1:].float())], -1)
        ids = torch.cat([ids, torch.full_like(ids[:, :1], scores.shape[1])], -1)
    return weights, ids


@triton.jit
def _route_topk_kernel(logits_ptr, w_ptr, ids_ptr, E, stride,
                       K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                       RENORM: tl.constexpr, SHARED: tl.constexpr, KS: tl.constexpr,
                       ROUND_BF16: tl.constexpr,
                       PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    emask = cols < E
    x = tl.load(logits_ptr + b * stride + cols, mask=emask, other=float("-inf")).to(tl.float32)
    if ROUND_BF16:  # fp32 sums routed as the bf16 logits a bf16 GEMV would have stored
        x = x.to(tl.bfloat16).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(emask, p, 0.0)
    probs = p / tl.sum(p, 0)
    # one max-reduction per slot: key = (probability bits, E-1-index) as int64; probabilities
    # are ≥ 0, so their fp32 bits order like the values; equal ones go lowest index first
    bits = probs.to(tl.int32, bitcast=True).to(tl.int64)
    keys = tl.where(emask, (bits << 32) | (BLOCK_E - 1 - cols).to(tl.int64), -1)
    slots = tl.arange(0, BLOCK_K)
    wk = tl.zeros([BLOCK_K], tl.float32)
    ik = tl.zeros([BLOCK_K], tl.int64)
    for j in tl.static_range(K):
        best = tl.max(keys, 0)
        v = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        idx = BLOCK_E - 1 - (best & 0xFFFF)  # BLOCK_E ≤ 512
        wk = tl.where(slots == j, v, wk)
        ik = tl.where(slots == j, idx, ik)
        keys = tl.where(keys == best, -1, keys)
    if RENORM:
        wk = wk / tl.sum(wk, 0)
    if SHARED:  # slot K: the shared expert (expert E), weighted by sigmoid(its score)
        score = tl.load(logits_ptr + b * stride + E).to(tl.float32)
        if ROUND_BF16:
            score = score.to(tl.bfloat16).to(tl.float32)
        wk = tl.where(slots == K, 1.0 / (1.0 + tl.exp(-score)), wk)
        ik = tl.where(slots == K, E, ik)
    kmask = slots < KS
    tl.store(w_ptr + b * KS + slots, wk, mask=kmask)
    tl.store(ids_ptr + b * KS + slots, ik, mask=kmask)


def route_topk_triton(logits, k, renormalise, shared=False, round_bf16=False, ids_out=None):
    """Triton path: one program per row; reads a row-strided view (a GEMV output's columns).
    `round_bf16`: fp32 logits (a split GEMV's sums) are rounded to bf16 first, so the choice
    matches the bf16 reference's (and fp32 summation order rarely matters)."""
    B, E = logits.shape[0], logits.shape[1] - shared
    assert E <= 512 and k + shared <= 16 and k <= E, (E, k)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ks = k + shared
    weights = torch.empty(B, ks, device=logits.device, dtype=torch.float32)
    ids = (torch.empty(B, ks, device=logits.device, dtype=torch.int64) if ids_out is None
           else ids_out)  # a caller's int64 [B, k + shared] (a step's routing log)
    _route_topk_kernel[(B,)](logits, weights, ids, E, logits.stride(0), K=k,
                             BLOCK_E=triton.next_power_of_2(E),
                             BLOCK_K=max(2, triton.next_power_of_2(ks)),
                             RENORM=bool(renormalise), SHARED=bool(shared), KS=ks,
                             ROUND_BF16=round_bf16,
                             num_warps=1, **pdl_launch(logits))  # warp-shuffle reductions
    return weights, ids


def route_topk(logits, k, renormalise, shared=False):
    """Dispatching entry point; see the module docstring."""
    fn = route_topk_triton if use_triton(logits) else route_topk_ref
    return fn(logits, k, renormalise, shared)
