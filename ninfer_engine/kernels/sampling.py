"""Fused argmax and top-k over a large vocabulary (the sampler's candidates: `step.sampling`).

Stage 1 (Triton) streams each row of logits `[B, V]` once in chunks of `CHUNK` columns: every
program keeps its chunk in registers and emits the chunk's maximum (argmax) or its k largest
values with their ids (top-k, by k rounds of max-and-mask). Stage 2 reduces the few candidates
per row with torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton

CHUNK = 4096
ARGMAX_CHUNK = 1024  # more programs: one pass over the row is all argmax needs


def argmax_ref(logits):
    """[B, V] -> [B] int64; ties pick the lowest id (torch.argmax behaviour)."""
    return logits.argmax(-1)


def topk_ref(logits, k):
    """[B, V] -> (values fp32 [B, k] descending, ids int64 [B, k])."""
    v, i = torch.topk(logits.float(), k, -1)
    return v, i


@triton.jit
def _chunk_topk_kernel(x_ptr, val_ptr, idx_ptr, V, n_chunks,
                       K: tl.constexpr, KB: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    slots = tl.arange(0, KB)
    vals = tl.full([KB], float("-inf"), tl.float32)
    ids = tl.zeros([KB], tl.int32)
    for j in range(K):
        m = tl.max(x, axis=0)
        # lowest id among the maxima, so ties resolve like torch.argmax
        i = tl.min(tl.where(x == m, offs, 2147483647), axis=0)
        vals = tl.where(slots == j, m, vals)
        ids = tl.where(slots == j, i, ids)
        x = tl.where(offs == i, float("-inf"), x)
    out = (row * n_chunks + c) * K + slots
    tl.store(val_ptr + out, vals, mask=slots < K)
    tl.store(idx_ptr + out, ids, mask=slots < K)


def topk_triton(logits, k, chunk=CHUNK):
    """Two-stage top-k: k candidates per chunk (Triton), then torch.topk over the candidates."""
    B, V = logits.shape
    n_chunks = triton.cdiv(V, chunk)
    vals = torch.empty(B, n_chunks * k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(B, n_chunks * k, dtype=torch.int32, device=logits.device)
    _chunk_topk_kernel[(B, n_chunks)](logits.contiguous(), vals, ids, V, n_chunks, K=k,
                                      KB=triton.next_power_of_2(k), CHUNK=chunk,
                                      num_warps=8)
    if n_chunks == 1:
        return vals, ids.long()
    # candidates sit in id order across chunks, so a stable sort keeps ties lowest-id first
    v, pos = torch.sort(vals, dim=-1, descending=True, stable=True)
    return v[:, :k], ids.gather(1, pos[:, :k]).long()


def argmax_triton(logits, chunk=ARGMAX_CHUNK):
    """Fused argmax: one candidate per chunk, then the first maximal candidate (lowest id)."""
    B, V = logits.shape
    n_chunks = triton.cdiv(V, chunk)
    vals = torch.empty(B, n_chunks, dtype=torch.float32, device=logits.device)
    ids = torch.empty(B, n_chunks, dtype=torch.int32, device=logits.device)
    _chunk_topk_kernel[(B, n_chunks)](logits.contiguous(), vals, ids, V, n_chunks, K=1, KB=1,
                                      CHUNK=chunk, num_warps=4)
    return ids.gather(1, vals.argmax(-1, keepdim=True))[:, 0].long()


def topk(logits, k):
    """Dispatching top-k; see the module docstring."""
    return (topk_triton if use_triton(logits) else topk_ref)(logits, k)


def argmax(logits):
    """Dispatching argmax; see the module docstring."""
    return (argmax_triton if use_triton(logits) else argmax_ref)(logits)
