"""Token masks of a step's constrained rows, computed together and applied on the logits' device.

llguidance fills one bit per token for every constrained row in one call (its executor spreads
the rows over threads, without the GIL) into a host int32 buffer; the buffer goes to the
logits' device in one copy and is unpacked there, so a CUDA step adds no host round trip: the
mask of the next step needs the sampled token, which the sampler copies to the host anyway.
"""
from __future__ import annotations

import threading

import llguidance
import torch

from .matcher import TokenConstraint

_EXECUTOR: llguidance.LLExecutor | None = None
_LOCK = threading.Lock()
# byte value -> its 8 bits, lowest first: unpacking by lookup is about twice as fast as shifting
# every word 32 times. The words are little-endian, so byte k of a row holds tokens 8k..8k+7.
_BITS = ((torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1).bool()
_TABLES: dict[torch.device, torch.Tensor] = {}


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = llguidance.LLExecutor()
        return _EXECUTOR


def bitmasks(constraints: list[TokenConstraint]) -> torch.Tensor:
    """The allowed-token bits of each constraint's next token: int32 [n, ceil(vocab / 32)]."""
    for constraint in constraints:
        constraint.check()
    words = (constraints[0].vocab + 31) // 32
    buffer = torch.zeros((len(constraints), words), dtype=torch.int32)
    pairs = [(c.matcher, i) for i, c in enumerate(constraints)]
    _executor().unsafe_compute_mask_ptr(pairs, buffer.data_ptr(), words * 4, len(constraints))
    return buffer


def allowed(bits: torch.Tensor, columns: int, device: torch.device) -> torch.Tensor:
    """Unpack int32 bit words [n, W] into a bool mask [n, columns] on `device` (bits past the
    tokenizer's vocabulary, e.g. padded embedding rows, are not allowed)."""
    table = _TABLES.get(device)
    if table is None:
        table = _TABLES.setdefault(device, _BITS.to(device))
    words = bits.to(device, non_blocking=True)
    unpacked = table[words.view(torch.uint8).long()].view(words.shape[0], -1)
    if unpacked.shape[1] >= columns:
        return unpacked[:, :columns]
    pad = torch.zeros((words.shape[0], columns - unpacked.shape[1]), dtype=torch.bool,
                      device=device)
    return torch.cat([unpacked, pad], dim=1)


def apply_constraints(logits: torch.Tensor, rows: list[int],
                      constraints: list[TokenConstraint]) -> torch.Tensor:
    """`logits` [B, V] with every token the constraint of row rows[i] forbids set to -inf; a
    copy (the caller's logits stay as they were)."""
    bits = bitmasks(constraints)
    mask = allowed(bits, logits.shape[1], logits.device)
    if len(rows) == logits.shape[0]:
        return torch.where(mask, logits, float("-inf"))
    index = torch.tensor(rows, device=logits.device)
    masked = torch.where(mask, logits.index_select(0, index), float("-inf"))
    return logits.index_copy(0, index, masked)
