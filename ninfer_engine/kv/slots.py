"""Recurrent-state slots and prefix-reuse checkpoints (model-math.md §4, http-contract §4).

`StatePool` holds the recurrent (GDN conv + SSM) states of the hybrid family as rows of one
device tensor per (layer, field): running sequences hold one slot each, and so does every
checkpoint (a pool of its own). A slot is an index; the model's eager forward reads and writes
the slot's row views in place, and the decode step addresses the rows by index (vLLM's
`state_indices`, SGLang's `MambaPool`), so no state is copied into batch rows or back.
`PrefixCache` keeps checkpoints at exact token frontiers: the checkpoint's KV pages (full pages
shared with the sequence that made it, the partial last page copied) plus a copy of the
recurrent state. LRU eviction when checkpoint slots or pool pages run out.
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .cache import KvStorage, PagedKvCache

# per recurrent layer, its state fields: name -> (shape of one slot's row, dtype)
StateLayout = list[dict[str, tuple[tuple[int, ...], torch.dtype]]]


@dataclass(eq=False)
class StateSlot:
    """Row `index` of a `StatePool`: `layers[l]` is layer l's state over views of that row."""

    index: int
    layers: list[Any]

    def tensors(self) -> list[torch.Tensor]:
        return [v for layer in self.layers for v in vars(layer).values()
                if isinstance(v, torch.Tensor)]


class StatePool:
    """`total` state slots laid out by `layout` on `device`; `view(**fields)` builds one layer's
    state object over a slot's rows (e.g. `GDNState`). Slots are zeroed when acquired."""

    def __init__(self, total: int, layout: StateLayout, device: torch.device | str,
                 view: Callable[..., Any]) -> None:
        self.total = total
        self.fields = [{name: torch.zeros(total, *shape, dtype=dtype, device=device)
                        for name, (shape, dtype) in layer.items()} for layer in layout]
        self._view = view
        self._free = list(range(total - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def free(self) -> int:
        return len(self._free)

    def field(self, name: str) -> list[torch.Tensor]:
        """The `[total, ...]` tensor of field `name`, one per layer: what the step indexes."""
        return [layer[name] for layer in self.fields]

    def slot(self, index: int) -> StateSlot:
        """Slot `index` as a `StateSlot` (views; no ownership check)."""
        return StateSlot(index, [self._view(**{n: t[index] for n, t in layer.items()})
                                 for layer in self.fields])

    def acquire(self) -> StateSlot | None:
        if not self._free:
            return None
        slot = self.slot(self._free.pop())
        torch._foreach_zero_(slot.tensors())
        return slot

    def release(self, slot: StateSlot) -> None:
        self._free.append(slot.index)


def copy_state(src: StateSlot, dst: StateSlot) -> None:
    """Overwrite `dst`'s rows with `src`'s (one multi-tensor copy)."""
    torch._foreach_copy_(dst.tensors(), src.tensors())


@dataclass(eq=False)
class Checkpoint:
    """A conversation frontier; its KV pages are owned in the allocator under this object."""

    tokens: tuple[int, ...]
    state: StateSlot | None
    used: int = 0  # LRU clock value of the last match or save
    pages: list[int] = field(default_factory=list)


class PrefixIndex(ABC):
    """The prefix-cache interface the engine uses."""

    @abstractmethod
    def match(self, prompt: tuple[int, ...]) -> Checkpoint | None:
        """The longest checkpoint whose tokens are a strict prefix of `prompt`."""

    @abstractmethod
    def save(self, tokens: tuple[int, ...], cache: PagedKvCache,
             state: StateSlot | None) -> bool:
        """Checkpoint `cache` (and `state`) at `len(tokens)`; False when there is no room."""

    @abstractmethod
    def evict_lru(self) -> bool:
        """Drop the least recently used checkpoint; False when there is none."""


class PrefixCache(PrefixIndex):
    """At most `capacity` checkpoints in pool pages and state slots (`slots` None: KV only)."""

    def __init__(self, storage: KvStorage, slots: StatePool | None, capacity: int) -> None:
        self.storage = storage
        self.slots = slots
        self.capacity = capacity
        self.checkpoints: list[Checkpoint] = []
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self.checkpoints)

    def match(self, prompt):
        best = None
        for ckpt in self.checkpoints:
            n = len(ckpt.tokens)
            if n < len(prompt) and prompt[:n] == ckpt.tokens and (
                    best is None or n > len(best.tokens)):
                best = ckpt
        if best is not None:
            best.used = next(self._clock)
        return best

    def save(self, tokens, cache, state):
        if self.capacity == 0 or not tokens:
            return False
        for ckpt in self.checkpoints:
            if ckpt.tokens == tokens:
                ckpt.used = next(self._clock)
                return True
        while len(self.checkpoints) >= self.capacity or (self.slots and not self.slots.free):
            if not self.evict_lru():
                return False
        ckpt = Checkpoint(tokens, None, next(self._clock))
        n, page_tokens = len(tokens), self.storage.page_tokens
        full, partial = divmod(n, page_tokens)
        allocator = self.storage.allocator
        allocator.share(ckpt, cache.pages[:full])
        # the source keeps writing into its partial page, so the checkpoint takes a copy
        while partial and not allocator.lease(ckpt, n):
            if not self.evict_lru():
                allocator.release(ckpt)
                return False
        if partial:
            self.storage.copy_slots(cache.pages[full], allocator.table(ckpt)[full], partial)
        if self.slots is not None and state is not None:
            ckpt.state = self.slots.acquire()
            copy_state(state, ckpt.state)
        ckpt.pages = allocator.table(ckpt)
        self.checkpoints.append(ckpt)
        return True

    def restore(self, ckpt: Checkpoint, cache: PagedKvCache) -> None:
        """Give an empty `cache` the checkpoint's full pages (shared); see `copy_partial`."""
        full = len(ckpt.tokens) // self.storage.page_tokens
        self.storage.allocator.share(cache, ckpt.pages[:full])

    def copy_partial(self, ckpt: Checkpoint, cache: PagedKvCache) -> None:
        """Copy the checkpoint's partial last page into `cache`'s own page (already leased)."""
        full, partial = divmod(len(ckpt.tokens), self.storage.page_tokens)
        if partial:
            self.storage.copy_slots(ckpt.pages[full], cache.pages[full], partial)

    def evict_lru(self):
        if not self.checkpoints:
            return False
        victim = min(self.checkpoints, key=lambda c: c.used)
        self.checkpoints.remove(victim)
        self.storage.allocator.release(victim)
        if victim.state is not None and self.slots is not None:
            self.slots.release(victim.state)
        return True

    def clear(self) -> None:
        while self.evict_lru():
            pass
