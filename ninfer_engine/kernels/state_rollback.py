"""`state_rollback_triton(state, trail, kept, rows, slots, last)`: a verify step's GDN states
taken back by device counts, in one launch a field and only where a row rolls back.

`state` [L, S, ...] holds every GDN layer's state rows (the slot pool as one stack), `trail`
[L, last, B, ...] the state after each of a verify row's first `last` tokens (its last token's
is the slot itself); row b of the step, in state slot `slots[b]` and trail row `rows[b]`,
keeps its first `kept[b]` tokens (1 ≤ kept ≤ last + 1, on the device: a captured verify chain
never reads it on the host). Where kept[b] ≤ last every layer's slot takes
`trail[:, kept[b] - 1, rows[b]]`; where kept[b] = last + 1 the slot already holds the state
after its last token and nothing moves.

The torch form (`state_rollback_ref`, the step's before) reads and writes every row of every
layer whatever it keeps: an index_select of the slots, a gather of the trail, a where and an
index_copy, ~8 bytes moved per state byte. On the H100's 35B-A3B verify chain (30 GDN layers,
2 MiB of SSM state each) the SSM field's four ops took ~280 µs a round under the profiler
(bench/results/h100-issue-bounds.json, the MTP row's kernels); the kernel copies 2 bytes per
state byte of the rows that roll back and nothing else (not yet timed on a GPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rollback_kernel(state_ptr, trail_ptr, kept_ptr, rows_ptr, slots_ptr, n, last,
                     s_layer, s_slot, t_layer, t_step, t_row, BLOCK: tl.constexpr):
    layer = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    kept = tl.load(kept_ptr + b)
    if kept <= last:  # (a row that kept every token: its slot is already the state)
        row = tl.load(rows_ptr + b).to(tl.int64)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        src = trail_ptr + layer * t_layer + (kept - 1).to(tl.int64) * t_step + row * t_row
        dst = state_ptr + layer * s_layer + slot * s_slot
        for start in range(tl.program_id(2) * BLOCK, n, tl.num_programs(2) * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def state_rollback_ref(state: torch.Tensor, trail: torch.Tensor, kept: torch.Tensor,
                       rows: torch.Tensor, slots: torch.Tensor, last: int) -> None:
    """Torch form (see the module docstring)."""
    batch = kept.shape[0]
    back = kept <= last
    at = (kept - 1).clamp(max=last - 1)
    now = state.index_select(1, slots)
    then = trail[:, at, rows]
    mask = back.view(1, batch, *[1] * (now.dim() - 2))
    state.index_copy_(1, slots, torch.where(mask, then, now))


def state_rollback_triton(state: torch.Tensor, trail: torch.Tensor, kept: torch.Tensor,
                          rows: torch.Tensor, slots: torch.Tensor, last: int,
                          block: int = 4096, splits: int = 16) -> None:
    """One launch: grid (layers, rows, `splits` programs striding over a row's state, each a
    `block` of elements at a time). Each (layer, slot) and (layer, step, row) block must be
    contiguous and of one dtype."""
    L, batch = state.shape[0], kept.shape[0]
    n = state[0, 0].numel()
    assert state[0, 0].is_contiguous() and trail[0, 0, 0].is_contiguous()
    assert trail.dtype == state.dtype and trail[0, 0, 0].numel() == n
    splits = max(1, min(splits, triton.cdiv(n, block)))
    _rollback_kernel[(L, batch, splits)](
        state, trail, kept, rows, slots, n, last, state.stride(0), state.stride(1),
        trail.stride(0), trail.stride(1), trail.stride(2), BLOCK=block)
