"""Contiguous single-sequence KV cache: the reference `SequenceKv` for standalone model use.

The engine serves from the shared paged pool (`ninfer_engine.kv`); this cache backs
`LlamaModel.new_cache()` for scripts and tests that run one sequence without a pool.
"""
from __future__ import annotations

import torch

GROW_TOKENS = 256


class ContiguousKvCache:
    """K and V for every layer of one sequence, laid out [layers, capacity, kv_heads, head_dim]."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 grow_tokens: int = GROW_TOKENS) -> None:
        self._shape = (num_layers, 0, num_kv_heads, head_dim)
        self._grow = grow_tokens
        self.k = torch.empty(self._shape, dtype=dtype, device=device)
        self.v = torch.empty(self._shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def reserve(self, tokens: int) -> bool:
        """Make room for `tokens` positions, copying into a larger allocation when needed."""
        if tokens <= self.capacity:
            return True
        new_capacity = -(-tokens // self._grow) * self._grow
        layers, _, heads, dim = self._shape
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty((layers, new_capacity, heads, dim))
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        return True

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer, start:start + k.shape[0]] = k
        self.v[layer, start:start + v.shape[0]] = v

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :end], self.v[layer, :end]
