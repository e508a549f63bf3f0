"""Per-request contiguous KV cache: one preallocated tensor pair, grown in fixed steps.

The skeleton's cache; the paged pool (`ninfer_engine/kv/`) replaces it behind the same
`Segment` seam.
"""
from __future__ import annotations

import torch

GROW_TOKENS = 256


class ContiguousKvCache:
    """K and V for every layer of one sequence, laid out [layers, kv_heads, capacity, head_dim]."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 grow_tokens: int = GROW_TOKENS) -> None:
        self._shape = (num_layers, num_kv_heads, 0, head_dim)
        self._grow = grow_tokens
        self.k = torch.empty(self._shape, dtype=dtype, device=device)
        self.v = torch.empty(self._shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def reserve(self, tokens: int) -> None:
        """Make room for `tokens` positions, copying into a larger allocation when needed."""
        if tokens <= self.capacity:
            return
        new_capacity = -(-tokens // self._grow) * self._grow
        layers, heads, _, dim = self._shape
        shape = (layers, heads, new_capacity, dim)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.empty(shape, dtype=old.dtype, device=old.device)
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)

    def release(self) -> None:
        """Drop the storage (the request finished or was cancelled)."""
        self.k = self.k.new_empty(self._shape)
        self.v = self.v.new_empty(self._shape)
