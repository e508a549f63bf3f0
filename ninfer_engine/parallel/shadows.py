"""A follower's stand-ins for rank 0's sequences (`lockstep`): what the runner, the decode
graphs, the MTP drafter and the vision inputs read of a sequence, rebuilt from the step plans.

A `Shadow` lives from the first plan that names its key until rank 0 says the sequence ended:
its identity is what the MTP drafter keys its state by, and its prompt and output are rank 0's
(the plans send the prompt once and each output token once), so the drafter's head calls here
are the same calls with the same inputs as on rank 0 and the collectives inside them pair up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from ..kv.cache import PagedKvCache
from ..step.scheduler import Batch, Chunk
from ..vision.tower import step_media
from .mirror import replay


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
    """A follower's stand-in for one of rank 0's sequences."""

    cache: MirroredCache
    cached: int = 0
    state: Any = None
    prompt: tuple[int, ...] = ()
    output: list[int] = field(default_factory=list)
    observed: bool = False  # its hiddens go to the MTP drafter (rank 0's `Speculator.observes`)
    request: Any = field(default_factory=lambda: _request(None))
    media_rows: dict = field(default_factory=dict)  # media item -> encoder rows rank 0 sent

    @property
    def rope_delta(self) -> int:
        media = self.request.media
        return 0 if media is None else media.rope_delta


def _request(media) -> SimpleNamespace:
    """What a stand-in's step reads of rank 0's request: its media, and no prompt scoring
    (rank 0 refuses prompt log-probabilities at tp > 1)."""
    return SimpleNamespace(media=media, prompt_logprobs=None)


class MirroredVision:
    """The follower's stand-in for rank 0's vision tower: the encoder rows rank 0 sent."""

    def step_inputs(self, work: list, device: torch.device):
        return step_media(work, device, lambda seq, item: seq.media_rows[item])


class Shadows:
    """The followers' stand-in sequences by rank 0's key, state slots by index."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.seqs: dict[int, Shadow] = {}
        self._grow_owner = object()

    def rows(self, rows: tuple) -> list[Shadow]:
        """The shadows of `rows` (`lockstep.RowPlan`), brought up to rank 0's state."""
        return [self._update(row) for row in rows]

    def batch(self, plan: Any) -> Batch:
        self._mirror_growth(plan.pool_pages)
        replay(self.memory, plan.copies)  # before the rows: a restored slot is not zeroed
        decode = self.rows(plan.decode)
        chunks = []
        for row in plan.chunks:
            seq = self._update(row)
            if seq.state is not None and row.cached == 0:
                # rank 0 zeroed the slot when it admitted the request
                seq.state.pool.zero(seq.state.index)
            chunks.append(Chunk(seq, len(row.tokens)))
        sampled = [self.seqs[row.key] for row in (*plan.decode, *plan.chunks) if row.sampled]
        return Batch(decode, chunks, sampled, [list(d) for d in plan.drafts])

    def media(self, items: tuple, rows: torch.Tensor) -> None:
        """Encoder rows rank 0 sent: `rows` holds those of each (key, item, count) in turn."""
        at = 0
        for key, item, count in items:
            self.seqs[key].media_rows[item] = rows[at: at + count]
            at += count

    def end(self, keys: tuple[int, ...], drafter: Any = None) -> None:
        for key in keys:
            seq = self.seqs.pop(key, None)
            if seq is not None and drafter is not None:
                drafter.forget(seq)

    def _update(self, row: Any) -> Shadow:
        seq = self.seqs.get(row.key)
        if seq is None:
            seq = self.seqs[row.key] = Shadow(MirroredCache(self.memory.storage))
        seq.cache.mirrored = list(row.pages)  # tables only grow, so kept tensors stay valid
        seq.cached, seq.observed = row.cached, row.observed
        seq.state = None if row.slot is None else self.memory.running_slots.slot(row.slot)
        if row.prompt is not None:
            seq.prompt = row.prompt
        if row.media is not None:
            seq.request = _request(row.media)
        seq.output.extend(row.output)
        return seq

    def _mirror_growth(self, pages: int) -> None:
        """Grow an elastic pool to rank 0's size (a lease this rank takes and gives back)."""
        allocator = self.memory.allocator
        if allocator.total < pages:
            if not allocator.lease(self._grow_owner, pages * allocator.page_tokens):
                raise MemoryError(f"this rank's KV pool cannot grow to {pages} pages")
            allocator.release(self._grow_owner)
