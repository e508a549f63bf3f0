"""Token masks of a step's constrained rows, computed together and applied on the logits' device.

llguidance fills one bit per token for every constrained row in one call (its executor spreads
the rows over threads, without the GIL) into a host int32 buffer; the buffer goes to the
logits' device in one copy (asynchronous from page-locked memory) and applied there in one
kernel (`kernels.token_mask`), so a CUDA step adds no host round trip: the mask of the next
step needs the sampled token, which the sampler copies to the host anyway. `prefetch.py`
fills that next mask while the forward runs.
"""
from __future__ import annotations

import threading

import llguidance
import torch

from ..kernels.token_mask import allowed, masked_logits  # noqa: F401 (allowed: callers')
from .matcher import TokenConstraint

_EXECUTOR: llguidance.LLExecutor | None = None
_LOCK = threading.Lock()


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = llguidance.LLExecutor()
        return _EXECUTOR


def new_buffer(rows: int, vocab: int, pin: bool = False, zeroed: bool = True) -> torch.Tensor:
    """A host int32 bit buffer [rows, ceil(vocab / 32)], zeroed unless `zeroed` is False (a
    buffer `fill` writes whole: llguidance writes every word of a row, the bits past the
    vocabulary too); `pin`: page-locked, so its copy to a CUDA device is asynchronous (torch's
    pinned allocator keeps a freed buffer until the copies that read it are done, so each
    step may take a fresh one)."""
    shape = (rows, (vocab + 31) // 32)
    if zeroed:
        return torch.zeros(shape, dtype=torch.int32, pin_memory=pin)
    return torch.empty(shape, dtype=torch.int32, pin_memory=pin)


def fill(pairs: list[tuple[llguidance.LLMatcher, int]], bits: torch.Tensor) -> None:
    """Fill row `i` of `bits` with the next-token mask of each (matcher, i), all rows in one
    executor call (without the GIL)."""
    words = bits.shape[1]
    _executor().unsafe_compute_mask_ptr(pairs, bits.data_ptr(), words * 4, bits.shape[0])


def fill_drafts(rows: list[tuple[llguidance.LLMatcher, int, list[int]]],
                bits: torch.Tensor) -> None:
    """For each (matcher, i, k drafts the matcher accepts), fill rows i..i + k of `bits` with
    the masks after 0..k of the drafts (a verify row's), all in one executor call (without the
    GIL); each matcher is left where it was (the drafts are consumed, then rolled back)."""
    _executor().unsafe_compute_mask_ptr_with_draft_token(rows, bits.data_ptr(),
                                                         bits.shape[1] * 4, bits.shape[0])


def bitmasks(constraints: list[TokenConstraint], pin: bool = False) -> torch.Tensor:
    """The allowed-token bits of each constraint's next token: int32 [n, ceil(vocab / 32)],
    computed now (`prefetch.bitmasks` takes rows filled in the background)."""
    for constraint in constraints:
        constraint.check()
    buffer = new_buffer(len(constraints), constraints[0].vocab, pin, zeroed=False)
    fill([(c.matcher, i) for i, c in enumerate(constraints)], buffer)
    return buffer


def apply_constraints(logits: torch.Tensor, rows: list[int],
                      constraints: list[TokenConstraint],
                      bits: torch.Tensor | None = None) -> torch.Tensor:
    """`logits` [B, V] with every token the constraint of row rows[i] forbids set to -inf; a
    copy (the caller's logits stay as they were). `bits`: the constraints' masks already
    filled (`prefetch.bitmasks`), else they are filled now."""
    if bits is None:
        bits = bitmasks(constraints, logits.device.type == "cuda")
    return masked_logits(logits, bits, rows)
