"""The lookahead step: a pure-decode step launched on the device's picks of the step before,
before the host has read them, so the host's work between steps runs while the GPU computes.

Without it a decode step is serial: replay the graph, wait for the picks, append them, emit,
schedule, load the next inputs, replay — and the GPU idles for the host's share (0.2 ms of a
2.05 ms 35B-A3B step at batch 1 on the H200, 0.3 ms of the 27B's 13.7 ms; `bench/profile_step.py`).
With it the engine keeps one step in flight (vLLM's async scheduling, SGLang's overlap
scheduler): step n+1 replays with step n's picks as its input tokens (a device copy), then the
host reads step n's tokens and does its bookkeeping while n+1 runs.

Only steps whose outcome does not depend on the host between them go ahead (`Lookahead.holds`):
the same rows as the step before, every one plain decode on a captured graph, sampled without
host state (no grammar, log-probabilities or forced thinking close; penalties count the pick in
flight on the device), far from its length limits and inside its lease. A row that ends at
step n (EOS, a stop string) has computed step n+1 too: its pick is dropped, and its K/V and
recurrent state already cover its last token — which is what `cached` then says, so a
checkpoint of it stays consistent. Everything
else (a new arrival, a cancel, a row near its end) settles the step in flight first and takes
the ordinary path, so those steps decode exactly as without lookahead. Under `--spec` the plain
steps go ahead while the policy keeps choosing plain decode (`Speculator.plain_next`): it then
compares verify rounds with the plain steps a `--spec` off engine runs; a drafter reading the
target's hiddens gets each step's as it launches (`HybridRunner.forward_from`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .sampling import Picked, pick_rows, settles_on_device
from .scheduler import Batch
from .sequence import Sequence

# a row goes ahead only with this many tokens left before max_tokens and the context: the
# step in flight may be its last, and the one launched behind it must not be past its end
MARGIN_TOKENS = 3


@dataclass(frozen=True)
class InFlight:
    """A launched step whose picks the host has not read: its batch, picks and start time."""

    batch: Batch
    picked: Picked
    started: float


class Lookahead:
    """Decides whether a pure-decode batch's next step may launch before this one settles."""

    def __init__(self, runner, max_context: int, enabled: bool) -> None:
        self.runner = runner
        self.max_context = max_context
        self.enabled = enabled and hasattr(runner, "continues")  # a Leader runs in lockstep

    def holds(self, batch: Batch) -> bool:
        """Every row of `batch` may decode its next step from this step's device picks."""
        return (self.enabled and bool(batch.decode) and len(batch.sampled) == len(batch.decode)
                and all(self._row_holds(seq) for seq in batch.decode)
                and self.runner.continues(batch))

    def _row_holds(self, seq: Sequence) -> bool:
        cap = seq.thinking_cap
        return (seq.finish_reason is None and not seq.cancelled
                and settles_on_device(seq.sampler)
                and (cap is None or (not cap.forced and (
                    not cap.reasoning or cap.spent + MARGIN_TOKENS < cap.budget)))
                and seq.request.max_tokens - len(seq.output) >= MARGIN_TOKENS
                and seq.cached + MARGIN_TOKENS < self.max_context
                and seq.cached + MARGIN_TOKENS <= seq.cache.capacity)


def picked_tokens(seqs: list[Sequence], picked: Picked) -> list[int | None]:
    """`next_tokens` for rows picked on the device: each recorded by its sampler; None for a
    row that ended while its pick was in flight (dropped)."""
    tokens: list[int | None] = []
    for seq, token in zip(seqs, picked.values()):
        if seq.finish_reason is not None:
            tokens.append(None)
        elif seq.forced_due:  # `holds` keeps rows clear of it; the host's token wins anyway
            tokens.append(seq.take_forced())
        else:
            seq.sampler.record(token)
            tokens.append(token)
    return tokens


class StepLookahead:
    """The lookahead continuation of `Engine` (see the module docstring)."""

    def _continue(self) -> bool:
        """With a step in flight: launch the next one on its picks where `Lookahead` holds and
        nothing waits to be admitted, then settle the one in flight while the next runs."""
        flight, self._in_flight = self._in_flight, None
        batch = self._carried = flight.batch
        if (self.scheduler.may_admit(time.monotonic(), self._preparing)
                or self._stopping.is_set()
                or not self._lookahead.holds(batch)
                or (self.speculator is not None and not self.speculator.plain_next(batch.decode))):
            self._finish(batch, None, flight.started, flight.picked)
            return True
        started = time.perf_counter()
        self._faults.check_step(self._step)
        self._step += 1
        logits = self.runner.forward_from(batch, flight.picked.tokens)
        picked = pick_rows(logits, [s.sampler for s in batch.decode], flight.picked.tokens)
        self._finish(batch, None, flight.started, flight.picked)
        if all(seq.finish_reason is None for seq in batch.decode):
            self._in_flight = InFlight(batch, picked, started)
        else:  # a row ended: the rest settle now, and the next step is scheduled afresh
            self._finish(batch, None, started, picked)
        return True
