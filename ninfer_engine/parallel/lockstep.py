"""The engine's ranks in lockstep: rank 0 schedules, every rank runs the same forward.

Rank 0's runner is wrapped in a `Leader`: before a step runs there it broadcasts the step's
`StepPlan` (per row: its tokens, its first position, its page table and state slot, whether it
is sampled; the decode rows' drafts), and after a verify step the kept counts. Each other rank
(`parallel.follower`) brings its stand-in sequences (`shadows`) up to the plan and runs the same
runner on its own share of the weights, KV pool and state slots — the same page and slot ids,
since the pools are the same size — so the collectives inside the forward pair up. While idle
the leader sends a heartbeat every engine tick, so a rank that died is found within a tick
even without traffic.

`--spec mtp`: the MTP head is sharded like a text layer, so every rank runs each of its calls.
Rank 0's drafter (`LeaderDrafter`) announces a step's drafting rows before it drafts (`DRAFT`),
and the plans carry each row's prompt (once), its new output tokens and whether its hiddens are
observed; the followers' own `MtpDrafter` then makes the same head calls on the same inputs.
`--vision`: rank 0 encodes; a step's plan names the encoder rows first needed, which follow it
as one tensor broadcast on the step's group (NCCL on GPUs). The prefix cache: rank 0's tree
decides, and the plan carries its copies since the last step (`mirror`).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..step.scheduler import Batch
from .group import RankGroup
from .mirror import Recorder

FORWARD, KEEP, DRAFT, IDLE, STOP = "forward", "keep", "draft", "idle", "stop"
log = logging.getLogger("ninfer.engine")


@dataclass(frozen=True)
class RowPlan:
    key: int  # the sequence's number on rank 0 (its page table's identity across steps)
    tokens: tuple[int, ...]  # a decode row's last token, or a chunk's prompt tokens
    cached: int  # tokens already in the row's KV / state
    pages: tuple[int, ...]
    slot: int | None  # recurrent-state slot (hybrid family)
    sampled: bool
    observed: bool = False  # its hiddens go to the MTP drafter
    prompt: tuple[int, ...] | None = None  # the whole prompt, the first time the row is planned
    output: tuple[int, ...] = ()  # output tokens not sent before
    media: Any = None  # its `MediaPrompt` without pixels, the first time (vision)


@dataclass(frozen=True)
class StepPlan:
    decode: tuple[RowPlan, ...]
    chunks: tuple[RowPlan, ...]
    drafts: tuple[tuple[int, ...], ...]
    pool_pages: int  # the KV pool's size on rank 0 (an elastic pool grows on every rank)
    ended: tuple[int, ...] = ()  # sequences rank 0 retired since its last message
    media: tuple[tuple[int, int, int], ...] = ()  # (key, item, rows) of encoder rows that follow
    copies: tuple[tuple, ...] = ()  # the prefix cache's copies since the last plan (`mirror`)


@dataclass(frozen=True)
class DraftPlan:
    """`MtpDrafter.propose_rows(rows, ks)` runs next on every rank."""

    rows: tuple[RowPlan, ...]
    ks: tuple[int, ...]
    ended: tuple[int, ...] = ()


class Leader:
    """Rank 0's runner: sends each step's plan to the other ranks, then runs it here.
    `observes(seq)`: whether the runner hands `seq`'s hiddens to a drafter (`--spec mtp`)."""

    def __init__(self, runner: Any, ranks: RankGroup, memory: Any,
                 observes: Callable[[Any], bool] | None = None) -> None:
        self.runner, self.ranks, self.allocator = runner, ranks, memory.allocator
        self.recorder = Recorder(memory)
        self.observes = observes or (lambda seq: False)
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._sent: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # outputs sent
        self._media_sent: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._ended: list[int] = []
        self._next = itertools.count()

    def __getattr__(self, name: str) -> Any:  # model, graphs, hidden_sink of the runner
        return getattr(self.runner, name)

    def _row(self, seq: Any, tokens: list[int], sampled: bool) -> RowPlan:
        first = seq not in self._keys
        if first:
            self._keys[seq] = next(self._next)
        sent = self._sent.get(seq, 0)
        self._sent[seq] = len(seq.output)
        media = seq.request.media
        return RowPlan(self._keys[seq], tuple(tokens), seq.cached, tuple(seq.cache.pages),
                       None if seq.state is None else seq.state.index, sampled,
                       self.observes(seq), tuple(seq.prompt) if first else None,
                       tuple(seq.output[sent:]),
                       dataclasses.replace(media, items=()) if first and media else None)

    def _drain_ended(self) -> tuple[int, ...]:
        ended, self._ended = tuple(self._ended), []
        return ended

    def plan(self, batch: Batch) -> StepPlan:
        sampled = set(map(id, batch.sampled))
        decode = tuple(self._row(seq, [seq.output[-1]], id(seq) in sampled)
                       for seq in batch.decode)
        chunks = tuple(self._row(c.seq, c.seq.prompt[c.seq.cached: c.seq.cached + c.tokens],
                                 id(c.seq) in sampled) for c in batch.chunks)
        media = []
        for c in batch.chunks:  # encoder rows rank 0 holds and the followers do not yet
            done = self._media_sent.setdefault(c.seq, set())
            for item in sorted(set(getattr(c.seq, "media_rows", {})) - done):
                media.append((self._keys[c.seq], item, c.seq.media_rows[item]))
                done.add(item)
        return StepPlan(decode, chunks, tuple(map(tuple, batch.drafts)), self.allocator.total,
                        self._drain_ended(), tuple((k, i, len(r)) for k, i, r in media),
                        self.recorder.drain()), [r for _, _, r in media]

    def forward(self, batch: Batch):
        plan, media = self.plan(batch)
        self.ranks.broadcast((FORWARD, plan))
        if media:  # after the plan, on the step's group (one device copy with NCCL)
            model = self.runner.model
            self.ranks.broadcast_tensor(torch.cat(media).to(model.device, model.dtype))
        return self.runner.forward(batch)

    def drafts(self, seqs: list, ks: list[int]) -> None:
        """The other ranks' drafters draft for these rows next (`LeaderDrafter`)."""
        rows = tuple(self._row(seq, [seq.output[-1]], False) for seq in seqs)
        self.ranks.broadcast((DRAFT, DraftPlan(rows, tuple(ks), self._drain_ended())))

    def keep(self, batch: Batch, kept: list[int]) -> None:
        self.ranks.broadcast((KEEP, list(kept)))
        self.runner.keep(batch, kept)

    def forget(self, seq: Any) -> None:
        """`seq` ended: the other ranks drop its stand-in with the next message."""
        key = self._keys.pop(seq, None)
        if key is not None:
            self._ended.append(key)

    def idle(self) -> None:
        self.ranks.broadcast((IDLE, self._drain_ended()))

    def close(self) -> None:
        try:
            self.ranks.broadcast((STOP, None))
        except Exception as exc:  # a follower gone already: stopping must not fail on it
            log.warning("tensor-parallel ranks not told to stop: %s", exc)


class LeaderDrafter:
    """Rank 0's model drafter (`MtpDrafter`): each batch of proposals is announced to the
    other ranks first, whose drafters then make the same head calls."""

    def __init__(self, drafter: Any, leader: Leader) -> None:
        self.drafter, self.leader = drafter, leader

    def __getattr__(self, name: str) -> Any:  # head, vocab of the drafter
        return getattr(self.drafter, name)

    def observe(self, seq: Any, position: int, hidden: torch.Tensor) -> None:
        self.drafter.observe(seq, position, hidden)

    def forget(self, seq: Any) -> None:
        self.drafter.forget(seq)

    def propose_rows(self, seqs: list, ks: list[int]) -> list[list[int]]:
        if any(ks):  # no row drafting: no head call anywhere
            self.leader.drafts(seqs, ks)
        return self.drafter.propose_rows(seqs, ks)
