"""The engine's ranks in lockstep: rank 0 schedules, every rank runs the same forward.

Rank 0's runner is wrapped in a `Leader`: before a step runs there it broadcasts the step's
`StepPlan` (per row: its tokens, its first position, its page table and state slot, whether it
is sampled; the decode rows' drafts), and after a verify step the kept counts. Each other rank
(`parallel.follower`) rebuilds the step's `Batch` over stand-in sequences (`shadow_batch`) on
its own share of the weights, KV pool and state slots — the same page and slot ids, since the
pools are the same size — and runs the same runner, so the collectives inside the forward pair
up. While idle the leader sends a heartbeat every engine tick, so a rank that died is found
within a tick even without traffic.
"""
from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..kv.cache import PagedKvCache
from ..step.scheduler import Batch, Chunk
from .group import RankGroup

FORWARD, KEEP, IDLE, STOP = "forward", "keep", "idle", "stop"
log = logging.getLogger("ninfer.engine")


@dataclass(frozen=True)
class RowPlan:
    key: int  # the sequence's number on rank 0 (its page table's identity across steps)
    tokens: tuple[int, ...]  # a decode row's last token, or a chunk's prompt tokens
    cached: int  # tokens already in the row's KV / state
    pages: tuple[int, ...]
    slot: int | None  # recurrent-state slot (hybrid family)
    sampled: bool


@dataclass(frozen=True)
class StepPlan:
    decode: tuple[RowPlan, ...]
    chunks: tuple[RowPlan, ...]
    drafts: tuple[tuple[int, ...], ...]
    pool_pages: int  # the KV pool's size on rank 0 (an elastic pool grows on every rank)


class Leader:
    """Rank 0's runner: sends each step's plan to the other ranks, then runs it here."""

    def __init__(self, runner: Any, ranks: RankGroup, allocator: Any) -> None:
        self.runner, self.ranks, self.allocator = runner, ranks, allocator
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._next = itertools.count()

    def __getattr__(self, name: str) -> Any:  # model, graphs, hidden_sink of the runner
        return getattr(self.runner, name)

    def _key(self, seq: Any) -> int:
        if seq not in self._keys:
            self._keys[seq] = next(self._next)
        return self._keys[seq]

    def plan(self, batch: Batch) -> StepPlan:
        sampled = set(map(id, batch.sampled))

        def row(seq: Any, tokens: list[int]) -> RowPlan:
            return RowPlan(self._key(seq), tuple(tokens), seq.cached, tuple(seq.cache.pages),
                           None if seq.state is None else seq.state.index, id(seq) in sampled)

        return StepPlan(
            tuple(row(seq, [seq.output[-1]]) for seq in batch.decode),
            tuple(row(c.seq, c.seq.prompt[c.seq.cached: c.seq.cached + c.tokens])
                  for c in batch.chunks),
            tuple(map(tuple, batch.drafts)), self.allocator.total)

    def forward(self, batch: Batch):
        self.ranks.broadcast((FORWARD, self.plan(batch)))
        return self.runner.forward(batch)

    def keep(self, batch: Batch, kept: list[int]) -> None:
        self.ranks.broadcast((KEEP, list(kept)))
        self.runner.keep(batch, kept)

    def idle(self) -> None:
        self.ranks.broadcast((IDLE, None))

    def close(self) -> None:
        try:
            self.ranks.broadcast((STOP, None))
        except Exception as exc:  # a follower gone already: stopping must not fail on it
            log.warning("tensor-parallel ranks not told to stop: %s", exc)


class _Window:
    """A chunk's prompt tokens at their positions: `prompt[cached : cached + n]` as the runner
    slices it."""

    def __init__(self, start: int, tokens: tuple[int, ...]) -> None:
        self.start, self.tokens = start, tokens

    def __getitem__(self, window: slice) -> tuple[int, ...]:
        return self.tokens[window.start - self.start: window.stop - self.start]


class MirroredCache(PagedKvCache):
    """A page table set by rank 0 over this rank's pool (its own allocator is never used)."""

    def __init__(self, storage: Any) -> None:
        super().__init__(storage)
        self.mirrored: list[int] = []

    @property
    def pages(self) -> list[int]:
        return self.mirrored

    def release(self) -> None:
        self.mirrored = []


@dataclass(eq=False)
class Shadow:
    """A follower's stand-in for one of rank 0's sequences, for one step."""

    cache: MirroredCache
    cached: int
    state: Any
    output: list[int]
    prompt: _Window


class Shadows:
    """The followers' stand-in sequences: one `MirroredCache` per sequence while it runs (so
    the decode step's page tables refill only where a row grew), state slots by index."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self._caches: dict[int, MirroredCache] = {}
        self._grow_owner = object()

    def batch(self, plan: StepPlan) -> Batch:
        self._mirror_growth(plan.pool_pages)
        caches, shadows = {}, {}

        def shadow(row: RowPlan, prompt: bool) -> Shadow:
            cache = self._caches.get(row.key) or MirroredCache(self.memory.storage)
            cache.mirrored = list(row.pages)  # tables only grow, so kept tensors stay valid
            caches[row.key] = cache
            slots = self.memory.running_slots
            state = None if row.slot is None else slots.slot(row.slot)
            if state is not None and prompt and row.cached == 0:
                # rank 0 zeroed the slot when it admitted the request
                torch._foreach_zero_(state.tensors())
            shadows[row.key] = Shadow(cache, row.cached, state, [row.tokens[-1]],
                                      _Window(row.cached, row.tokens))
            return shadows[row.key]

        decode = [shadow(row, False) for row in plan.decode]
        chunks = [Chunk(shadow(row, True), len(row.tokens)) for row in plan.chunks]
        self._caches = caches  # a sequence absent this step refills its table when back
        sampled = [shadows[row.key] for row in (*plan.decode, *plan.chunks) if row.sampled]
        return Batch(decode, chunks, sampled, [list(d) for d in plan.drafts])

    def _mirror_growth(self, pages: int) -> None:
        """Grow an elastic pool to rank 0's size (a lease this rank takes and gives back)."""
        allocator = self.memory.allocator
        if allocator.total < pages:
            if not allocator.lease(self._grow_owner, pages * allocator.page_tokens):
                raise MemoryError(f"this rank's KV pool cannot grow to {pages} pages")
            allocator.release(self._grow_owner)
