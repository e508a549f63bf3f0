"""Grammar masks applied to a step's logits: every token a row's packed bits forbid set to -inf.

The bits are llguidance's layout (`constrained.mask`): int32 words [n, W], token t allowed when
bit t % 32 of word t // 32 is set; logits columns past 32·W (padded embedding rows) are
forbidden. `rows[i]` is the logits row that bits row i masks; the other rows are copied as they
are. The result is a copy: the caller's logits stay as they were.

The torch reference unpacks the bits to a bool [n, V] and selects, 5-8 ops (with an index
select and copy when only some rows have a grammar); on a GPU each is a launch and a host
dispatch: 0.26-0.32 ms of host time a step at B = 8 on the H200, 0.15-0.22 ms with the kernel
(bench/results/h200-mask-overlap-ab.md, "apply"). The kernel is one launch, one program per row
and block of columns.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import use_triton

BLOCK = 2048  # logits columns a program masks

# each byte ANDed with its 8 bit weights, lowest first: 1.4-2x faster on the CPU than a 256-entry
# lookup table (no int64 index tensor), which was twice as fast as shifting every word 32 times.
# The words are little-endian, so byte k of a row holds tokens 8k..8k+7.
_WEIGHTS = (1 << torch.arange(8, dtype=torch.int16)).to(torch.uint8)
_TABLES: dict[torch.device, torch.Tensor] = {}


def allowed(bits: torch.Tensor, columns: int, device: torch.device) -> torch.Tensor:
    """Unpack int32 bit words [n, W] into a bool mask [n, columns] on `device` (bits past the
    tokenizer's vocabulary, e.g. padded embedding rows, are not allowed)."""
    weights = _TABLES.get(device)
    if weights is None:
        weights = _TABLES.setdefault(device, _WEIGHTS.to(device))
    words = bits.to(device, non_blocking=True)
    unpacked = words.view(torch.uint8).unsqueeze(-1).bitwise_and(weights).bool()
    unpacked = unpacked.view(words.shape[0], -1)
    if unpacked.shape[1] >= columns:
        return unpacked[:, :columns]
    pad = torch.zeros((words.shape[0], columns - unpacked.shape[1]), dtype=torch.bool,
                      device=device)
    return torch.cat([unpacked, pad], dim=1)


def masked_logits_ref(logits: torch.Tensor, bits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`logits` [B, V] with the tokens each bits row forbids in its logits row set to -inf."""
    mask = allowed(bits, logits.shape[1], logits.device)
    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):
        return torch.where(mask, logits, float("-inf"))
    index = torch.tensor(rows, device=logits.device)
    masked = torch.where(mask, logits.index_select(0, index), float("-inf"))
    return logits.index_copy(0, index, masked)


@triton.jit
def _masked_logits_kernel(logits_ptr, out_ptr, words_ptr, slots_ptr, V, W, stride_in,
                          ALL_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_in + cols, mask=inside)
    word = cols // 32
    live = inside & (word < W)
    if ALL_ROWS:
        slot = row
    else:
        slot = tl.load(slots_ptr + row)  # its bits row; -1: no grammar
        # slot broadcast over the columns: the interpreter refuses a scalar in a load's mask
        live = live & (tl.zeros_like(cols) + slot >= 0)
    bits = tl.load(words_ptr + slot.to(tl.int64) * W + word, mask=live, other=0)
    keep = ((bits >> (cols % 32)) & 1) != 0
    if not ALL_ROWS:
        keep = keep | (tl.zeros_like(cols) + slot < 0)
    tl.store(out_ptr + row.to(tl.int64) * V + cols, tl.where(keep, x, float("-inf")),
             mask=inside)


def masked_logits_triton(logits: torch.Tensor, bits: torch.Tensor,
                         rows: list[int]) -> torch.Tensor:
    """`masked_logits_ref` in one launch (`bits` already on the logits' device)."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    batch, columns = logits.shape
    out = torch.empty((batch, columns), dtype=logits.dtype, device=logits.device)
    every = len(rows) == batch and rows == list(range(batch))
    slots = bits  # unread when every row has its own bits row, in order
    if not every:
        index = [-1] * batch
        for i, row in enumerate(rows):
            index[row] = i
        slots = torch.tensor(index, dtype=torch.int32).to(logits.device, non_blocking=True)
    words = bits.contiguous()
    _masked_logits_kernel[(batch, triton.cdiv(columns, BLOCK))](
        logits, out, words, slots, columns, words.shape[1], logits.stride(0),
        ALL_ROWS=every, BLOCK=BLOCK)
    return out


def masked_logits(logits: torch.Tensor, bits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Dispatching entry point; see the module docstring."""
    if use_triton(logits):
        return masked_logits_triton(logits, bits.to(logits.device, non_blocking=True), rows)
    return masked_logits_ref(logits, bits, rows)
