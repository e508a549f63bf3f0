"""Presence and frequency penalties of a step's penalized rows in one kernel.

Each penalized row r (logits row `rows[r]`) has its counted tokens `ids[offsets[r]:offsets[r+1]]`,
distinct, counted `times` each; the logit of a token counted c > 0 times becomes
`logit - (frequency·c + presence)`, in fp32, rounded once to the logits' dtype. `pending` [B]
(optional): each logits row's pick of the step in flight, not counted yet, is counted once more
(the lookahead step); a pick not among the row's counted tokens is counted once.

The torch reference needs ~20 small ops a step; on the GPU each is a launch and a host-side
dispatch, which made the penalties the largest host cost of a served decode step (H200,
35B-A3B shape: 0.4-0.6 ms a step). The kernel is one launch: one program per penalized row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton

BLOCK = 128  # counted tokens a program reads at once


def penalize_ref(logits: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor,
                 presence: torch.Tensor, frequency: torch.Tensor, ids: torch.Tensor,
                 times: torch.Tensor, pending: torch.Tensor | None = None) -> torch.Tensor:
    """`logits` [B, V] penalized in place (see the module docstring) and returned. `offsets`
    [R+1], `rows` [R], `ids` [N] int64; `presence`, `frequency` [R], `times` [N] fp32."""
    device, count = logits.device, len(rows)
    sizes = offsets[1:] - offsets[:-1]
    entry = torch.repeat_interleave(torch.arange(count, device=device), sizes,
                                    output_size=len(ids))  # each id's position among the rows
    if pending is not None:  # a pick already counted: once more
        picks = pending.long()[rows]
        match = ids == picks[entry]
        times = times + match.to(times.dtype)
        seen = torch.zeros(count, dtype=torch.int32, device=device)
        seen.index_add_(0, entry, match.to(torch.int32))
    row = rows[entry]
    logits.index_put_((row, ids), lessen(logits[row, ids],
                                        penalty(times, presence[entry], frequency[entry])))
    if pending is not None:  # a pick not counted yet: its first occurrence
        first = penalty(torch.ones(count, device=device), presence, frequency)
        first = torch.where(seen > 0, torch.zeros_like(first), first)
        logits.index_put_((rows, picks), lessen(logits[rows, picks], first))
    return logits


def penalty(times: torch.Tensor, presence, frequency) -> torch.Tensor:
    """What the penalties subtract from a token counted `times` (> 0) times: one expression
    on every path (the kernel computes it unfused too), so the same counts give the same
    logits bit for bit."""
    return frequency * times + presence


def lessen(values: torch.Tensor, amount: torch.Tensor) -> torch.Tensor:
    """`values` less `amount`, in fp32 and rounded once to the logits' dtype."""
    return (values.float() - amount).to(values.dtype)


# the per-row buffers are slices of two packed ones: where they start depends on the rows
@triton.jit(do_not_specialize_on_alignment=["offsets_ptr", "rows_ptr", "presence_ptr",
                                            "frequency_ptr", "ids_ptr", "times_ptr",
                                            "pending_ptr"])
def _penalize_kernel(logits_ptr, stride, offsets_ptr, rows_ptr, presence_ptr, frequency_ptr,
                     ids_ptr, times_ptr, pending_ptr,
                     HAS_PENDING: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r)
    start = tl.load(offsets_ptr + r)
    end = tl.load(offsets_ptr + r + 1)
    presence = tl.load(presence_ptr + r)
    frequency = tl.load(frequency_ptr + r)
    base = logits_ptr + row * stride
    pick = tl.load(pending_ptr + row).to(tl.int64) if HAS_PENDING else -1
    seen = tl.full([], 0, tl.int32)
    for at in range(start, end, BLOCK):
        offs = at + tl.arange(0, BLOCK)
        live = offs < end
        token = tl.load(ids_ptr + offs, mask=live, other=0)
        times = tl.load(times_ptr + offs, mask=live, other=0.0)
        if HAS_PENDING:
            hit = (token == pick) & live
            times += hit.to(tl.float32)
            seen += tl.sum(hit.to(tl.int32), axis=0)
        value = tl.load(base + token, mask=live, other=0.0)
        less = frequency * times + presence
        tl.store(base + token, (value.to(tl.float32) - less).to(value.dtype), mask=live)
    if HAS_PENDING:
        if seen == 0:
            value = tl.load(base + pick)
            less = frequency * 1.0 + presence
            tl.store(base + pick, (value.to(tl.float32) - less).to(value.dtype))


def penalize_triton(logits: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor,
                    presence: torch.Tensor, frequency: torch.Tensor, ids: torch.Tensor,
                    times: torch.Tensor, pending: torch.Tensor | None = None) -> torch.Tensor:
    """`penalize_ref` in one launch (`logits` contiguous in its last dimension)."""
    if len(rows):
        # unfused multiply-add: the reference rounds the product before the sum
        _penalize_kernel[(len(rows),)](
            logits, logits.stride(0), offsets, rows, presence, frequency, ids, times,
            pending if pending is not None else rows, HAS_PENDING=pending is not None,
            BLOCK=BLOCK, enable_fp_fusion=False)
    return logits


def penalize(logits: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Dispatching penalties; see the module docstring."""
    return (penalize_triton if use_triton(logits) else penalize_ref)(logits, *args, **kwargs)
