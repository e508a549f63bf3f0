"""`--media-cache-mib`: encoder rows of recent media, keyed by digest and grid, least recently
used first out, so a repeated image skips the encoder. Rows are kept in host memory: the cache
never takes device memory the KV pool was sized around."""
from __future__ import annotations

from collections import OrderedDict

import torch


class MediaCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._rows: OrderedDict[str, torch.Tensor] = OrderedDict()

    def get(self, key: str) -> torch.Tensor | None:
        rows = self._rows.get(key)
        if rows is None:
            self.misses += 1
            return None
        self.hits += 1
        self._rows.move_to_end(key)
        return rows

    def put(self, key: str, rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        if size > self.capacity or key in self._rows:
            return
        while self.bytes + size > self.capacity:
            _, old = self._rows.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()
        self._rows[key] = rows.to("cpu", copy=True)  # not a view of a whole batch's output
        self.bytes += size
