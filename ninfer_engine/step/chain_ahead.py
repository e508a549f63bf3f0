"""`ChainAhead`: whether `--spec mtp`'s next verify round may launch before this one is read.

With the verify chain (`verify_chain`) a round's next inputs — each row's bonus and drafts at
its next positions — are on the device when its chain ends, so the engine can queue the next
round's verify step and chain behind it and only then read this round's results and do its
postprocess while the GPU computes: the host's share of a round (postprocess, schedule, the
next load) leaves the critical path, as the lookahead step (`lookahead.py`) takes it off plain
decoding's.

A round goes ahead only where nothing in it depends on the host between the two (`holds`): the
same rows as the step before, every one chained in it and none settled, no prompt chunk, no row
with a stop string (the host finds those in the text, after the fact), each far from its output
limit and the context (its round in flight cannot be cut short there; an end token is the one
ending the device sees, and it ends acceptance where it is drafted: `VerifyChain._chain`), the
speculation policy drafting at this batch size and no row paused for low acceptance. The engine
also keeps it back while requests wait to be admitted. Rows that end while the next round is
under way are settled by `VerifyChain.settle`.

`StepChainAhead` is the engine's step that does it (a part of `Engine`, as `StepPrepare` and
`StepPostprocess` are): it reads the engine's `runner`, `scheduler`, `_chain_ahead`,
`_chain_flight`, `_stopping`, `_faults` and `_step`, and finishes steps with `_finish`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..host_copy import to_device
from .scheduler import Batch
from .sequence import Sequence
from .verify_chain import chainable

log = logging.getLogger("ninfer.engine")


@dataclass(frozen=True)
class ChainFlight:
    """A chained verify step the host has not read: its batch, logits and start time."""

    batch: Batch
    logits: torch.Tensor
    started: float


class ChainAhead:
    """Decides whether a chained verify batch's next round may launch before it settles."""

    def __init__(self, runner, speculator, memory, max_context: int,
                 enabled: bool = True) -> None:
        self.runner, self.speculator, self.memory = runner, speculator, memory
        self.max_context, self.enabled = max_context, enabled

    def holds(self, batch: Batch) -> bool:
        """`batch`'s rows may verify their next round from the device's outputs of this one."""
        chain = getattr(self.runner, "chain", None)
        return (self.enabled and chain is not None and bool(batch.decode) and not batch.chunks
                and len(batch.sampled) == len(batch.decode) and chain.alone(batch.decode)
                and self.speculator.goes_on(batch.decode)
                and all(self._row_holds(seq, chain.k) for seq in batch.decode))

    def _row_holds(self, seq: Sequence, k: int) -> bool:
        return (seq.finish_reason is None and not seq.cancelled and chainable(seq)
                and not seq.request.stop and seq.request.max_tokens - len(seq.output) > 2 * (k + 1)
                and seq.cached + 4 * (k + 1) < self.max_context)

    def lease(self, batch: Batch) -> bool:
        """Each row's lease grown through the next round's MTP writes (up to 3k + 2 positions
        past its `cached`, which lags the round in flight); False: not every one grew."""
        k = self.runner.chain.k
        return all(self.memory.grow(seq, seq.cached + 3 * k + 3) for seq in batch.decode)


class StepChainAhead:
    """The chained-round continuation of `Engine` (see the module docstring)."""

    def _continue_chain(self) -> bool:
        """With a chained verify round unread: launch its next round from the device's outputs
        where `ChainAhead` holds and nothing waits to be admitted, then settle the one before
        while the next runs."""
        flight, self._chain_flight = self._chain_flight, None
        batch, chain = flight.batch, self.runner.chain
        self._carried = batch
        if (self.scheduler.may_admit(time.monotonic(), self._preparing)
                or self._stopping.is_set()
                or not self._chain_ahead.holds(batch) or not self._chain_ahead.lease(batch)):
            self._finish(batch, flight.logits, flight.started)
            return True
        started = time.perf_counter()
        self._faults.check_step(self._step)
        self._step += 1
        try:
            logits = self.runner.forward_ahead(batch)
        except Exception:  # past exact recovery: its rows end with the step (`step_failure`)
            log.error("--spec mtp: a verify round launched ahead failed; the host accepts "
                      "from now on")
            self.runner.chain = None
            raise
        self._finish(batch, flight.logits, flight.started)  # its next round's drafts read
        drafts = chain.ahead_drafts()
        live = [b for b, seq in enumerate(batch.decode) if seq.finish_reason is None]
        rows = [batch.decode[b] for b in live]
        if len(rows) == len(batch.decode):
            self._chain_flight = ChainFlight(Batch(rows, [], list(rows), drafts), logits,
                                             started)
        elif not rows:
            chain.discard()
        else:  # a row ended: the others settle now, the next step is scheduled afresh
            q = chain.k + 1
            at = to_device([b * q + t for b in live for t in range(q)], logits.device)
            self._finish(Batch(rows, [], list(rows), [drafts[b] for b in live]),
                         logits.index_select(0, at), started)
        return True
