"""Recurrent-state slots and prefix-reuse checkpoints (model-math.md §4, http-contract §4).

`StateSlots` counts the device slots that hold one sequence's GDN conv + SSM states: running
sequences take one each, and so does every checkpoint of the hybrid family.
`PrefixCache` keeps checkpoints at exact token frontiers: the checkpoint's KV pages (full pages
shared with the sequence that made it, the partial last page copied) plus a copy of the
recurrent state. LRU eviction when checkpoint slots or pool pages run out.
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch

from .cache import KvStorage, PagedKvCache

RecurrentState = list  # one state per recurrent layer, each with tensor fields (e.g. GDNState)


class StateSlots:
    """`total` recurrent-state slots; a slot is a fresh zero state handed to one holder."""

    def __init__(self, total: int, new_state: Callable[[], RecurrentState]) -> None:
        self.total = total
        self._new_state = new_state
        self.free = total

    def acquire(self) -> RecurrentState | None:
        if self.free == 0:
            return None
        self.free -= 1
        return self._new_state()

    def release(self) -> None:
        self.free += 1


def copy_state(src: RecurrentState, dst: RecurrentState) -> None:
    """Overwrite `dst`'s tensors with copies of `src`'s (layer by layer, field by field)."""
    for s, d in zip(src, dst):
        for name, value in vars(s).items():
            if isinstance(value, torch.Tensor):
                setattr(d, name, value.clone())


@dataclass(eq=False)
class Checkpoint:
    """A conversation frontier; its KV pages are owned in the allocator under this object."""

    tokens: tuple[int, ...]
    state: RecurrentState | None
    used: int = 0  # LRU clock value of the last match or save
    pages: list[int] = field(default_factory=list)


class PrefixIndex(ABC):
    """The prefix-cache interface the engine uses."""

    @abstractmethod
    def match(self, prompt: tuple[int, ...]) -> Checkpoint | None:
        """The longest checkpoint whose tokens are a strict prefix of `prompt`."""

    @abstractmethod
    def save(self, tokens: tuple[int, ...], cache: PagedKvCache,
             state: RecurrentState | None) -> bool:
        """Checkpoint `cache` (and `state`) at `len(tokens)`; False when there is no room."""

    @abstractmethod
    def evict_lru(self) -> bool:
        """Drop the least recently used checkpoint; False when there is none."""


class PrefixCache(PrefixIndex):
    """At most `capacity` checkpoints in pool pages and state slots (`slots` None: KV only)."""

    def __init__(self, storage: KvStorage, slots: StateSlots | None, capacity: int) -> None:
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
            self.slots.release()
        return True

    def clear(self) -> None:
        while self.evict_lru():
            pass
