"""A step's preparation, between schedule and run: the wait for a burst's other prompts
before scheduling, each row's lease grown for the step, its media encoded, its drafts (a
verify row) proposed.

`StepPrepare` is that half of `Engine` (as `StepPostprocess` is the other): it reads the
engine's `scheduler`, `memory`, `vision`, `speculator`, `max_context`, `_draft_cap`,
`_preparing`, `_wake` and `_stopping`, and hands requests that cannot run to `_retire` (after
`_fail_request` where they failed). A failure here ends the one request it belongs to.
"""
from __future__ import annotations

import dataclasses
import time

from .scheduler import Batch


class StepPrepare:
    """The preparation methods of `Engine` (see the module docstring)."""

    def _gather(self) -> bool:
        """Before scheduling: the wait `Scheduler.arrival_wait` allows for the requests the
        front end is still preparing (each hand-over wakes the engine with the new count).
        While rows decode, nothing waits: they take their steps, and the queued requests are
        admitted once the wait is over (False: not this step)."""
        while not self._stopping.is_set():
            wait = self.scheduler.arrival_wait(time.monotonic(), self._preparing)
            if wait <= 0:
                return True
            if self.scheduler.decoding:
                return False
            self._wake.wait(wait)
            self._wake.clear()
        return True

    def _reserve(self, batch: Batch) -> Batch:
        """Grow each lease for this step; a request whose lease cannot grow ends with `length`."""
        failed = []
        rows = [(seq, 1) for seq in batch.decode] + [(c.seq, c.tokens) for c in batch.chunks]
        for seq, tokens in rows:
            if not self.memory.grow(seq, seq.cached + tokens):
                seq.finish("length")
                failed.append(seq)
        if not failed:
            return batch
        for seq in failed:
            self._retire(seq)
        return Batch([s for s in batch.decode if s not in failed],
                     [c for c in batch.chunks if c.seq not in failed],
                     [s for s in batch.sampled if s not in failed])

    def _encode_media(self, batch: Batch) -> Batch:
        """The media this step's prompt chunks need, encoded before the forward; a request
        whose media fail to encode (out of memory, say) fails alone."""
        if self.vision is None:
            return batch
        failed = []
        for chunk in batch.chunks:
            try:
                self.vision.encode_chunk(chunk.seq, chunk.tokens)
            except Exception as exc:
                self._fail_request(chunk.seq, exc)
                failed.append(chunk.seq)
        for seq in failed:
            self._retire(seq)
        return batch if not failed else dataclasses.replace(
            batch, chunks=[c for c in batch.chunks if c.seq not in failed],
            sampled=[s for s in batch.sampled if s not in failed])

    def _draft(self, batch: Batch) -> Batch:
        """With `--spec`, each decode row's drafts (a verify row) where the speculator proposes
        some and the row's lease grows to cover them; other rows stay plain decode rows."""
        if self.speculator is None or not batch.decode:
            return batch
        cap = self._draft_cap(len(batch.decode))
        rooms = [min(seq.request.max_tokens - len(seq.output) - 1,
                     self.max_context - seq.cached - 2, self.speculator.k if cap is None else cap)
                 for seq in batch.decode]
        if self.speculator.kv_layers:  # the drafter writes its K/V at the drafts' positions
            rooms = [room if room <= 0 or self.memory.grow(seq, seq.cached + 1 + room) else 0
                     for seq, room in zip(batch.decode, rooms)]
            if getattr(self.runner, "chain", None) is not None:  # where pages allow, through
                for seq, room in zip(batch.decode, rooms):      # L + 2k: the round after a
                    if room > 0:                                 # verify chain writes there
                        self.memory.grow(seq, min(seq.cached + 1 + 2 * room, self.max_context))
        drafts = []
        for seq, d in zip(batch.decode, self.speculator.draft_rows(batch.decode, rooms)):
            if d and not self.memory.grow(seq, seq.cached + 1 + len(d)):
                d = []  # no pages for the drafts: decode the row plainly
            drafts.append(d)
        if not any(drafts):
            return batch
        for seq, d in zip(batch.decode, drafts):  # the verify graph pads each row to 1 + k
            if len(d) < self.speculator.k:          # tokens: its lease covers them where it
                self.memory.grow(seq, min(seq.cached + 1 + self.speculator.k,  # can (`pads`)
                                          self.max_context))
        return dataclasses.replace(batch, drafts=drafts)
