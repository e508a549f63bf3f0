"""The FIFO scheduler that batches the engine's requests (`Sequence`) into steps.

`Scheduler.schedule()` admits queued requests up to the concurrency limit and picks the
decode-ready batch plus prompt chunks under a token budget (`Batch`: decode rows, verify rows,
prompt chunks).
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..types import EngineError, TokenEvent, Usage
from .sequence import RequestError, Sequence

# a prompt step waits this long past its newest queued request's hand-over for requests the
# front end is still preparing (~5 ms each in an 8-request burst on the H200's host: five of a
# 1K-prompt burst's eight missed the first prompt step by ~1 ms and waited the whole step,
# bench/results/h200-prompt-burst-fp8-act.md; eight prompts in one step take ~3x one's time),
# and never more than `GATHER_LIMIT_S` past the oldest's arrival (the H100's bursts: seven of
# eight reached the engine 5-7 ms after the first and missed a window counted from it by a few
# ms, bench/results/h100-ttft-burst.md). From the hand-over, not the arrival: a burst arriving
# as the last one's streams end waited ~17 ms in the busy front end, past a window counted from
# its arrival, and split into two prompt steps (bench/results/h100-ttft-burst-handover.md)
ARRIVAL_WINDOW_S = 0.010
GATHER_LIMIT_S = 0.030


@dataclass(frozen=True)
class Chunk:
    """`tokens` prompt tokens of `seq`, computed from `seq.cached` on."""

    seq: Sequence
    tokens: int


@dataclass(frozen=True)
class Batch:
    """One step's rows: a token for each decode sequence (and its drafts: a verify row, where
    `drafts[i]` is not empty), then the prompt chunks."""

    decode: list[Sequence]
    chunks: list[Chunk] = field(default_factory=list)
    sampled: list[Sequence] = field(default_factory=list)  # get a token this step, in row order
    drafts: list[list[int]] = field(default_factory=list)  # per decode row; [] = none at all

    def drafts_of(self, i: int) -> list[int]:
        return self.drafts[i] if self.drafts else []

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk.tokens for chunk in self.chunks)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.chunks


class Scheduler:
    """FIFO admission under a running-request limit. A step decodes every sequence whose prompt
    is in, then fills up to `prefill_chunk` prompt tokens from the waiting prompts in admission
    order (several prompts when they fit), so decode never waits behind a whole prompt.

    An admitted request's first event is an empty admission event (usage: prompt and cached
    tokens, no text), so a stream can start before its first token.
    """

    def __init__(self, max_running: int, prefill_chunk: int, pending_timeout_s: float,
                 admit: Callable[[Sequence], None],
                 cut: Callable[[Sequence, int], int] | None = None) -> None:
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk
        self.pending_timeout_s = pending_timeout_s
        # validates and leases memory; False = wait for pages; RequestError = a bad request
        self._admit = admit
        # (seq, chunk tokens) -> the tokens to compute: where a prefix snapshot must be taken
        self._cut = cut
        self.pending: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._lock = threading.Lock()  # `add` runs on the event loop thread
        self._closed = False
        self._waiting: Sequence | None = None  # the head the last schedule left waiting for pages

    def add(self, seq: Sequence) -> bool:
        """Queue a sequence; False once the scheduler was drained (engine failed or stopped)."""
        with self._lock:
            if self._closed:
                return False
            self.pending.append(seq)
            return True

    @property
    def decoding(self) -> bool:
        """A running sequence has its prompt in: the next step decodes it."""
        return any(seq.prefill_done for seq in self.running)

    def schedule(self, now: float, admit: bool = True) -> tuple[Batch, list[Sequence]]:
        """The step's batch, and the sequences that ended without running (already finished).
        `admit` False: queued requests stay queued this step (a burst still arriving)."""
        ended = [s for s in self.running if s.cancelled]
        self.running = [s for s in self.running if not s.cancelled]
        with self._lock:
            for seq in [s for s in self.pending if s.cancelled or self._expired(s, now)]:
                self.pending.remove(seq)
                ended.append(seq)
            while admit and self.pending and len(self.running) < self.max_running:
                seq = self.pending[0]
                outcome = self._try_admit(seq, now)
                if outcome is None:
                    self._waiting = seq
                    break  # FIFO: the head waits for KV pages, nobody overtakes it
                self.pending.popleft()
                if outcome:
                    self.running.append(seq)
                else:
                    ended.append(seq)
        for seq in ended:
            if seq.finish_reason is None:
                self._end_unscheduled(seq)
        decode = [s for s in self.running if s.prefill_done]
        sampled = list(decode)
        chunks: list[Chunk] = []
        budget = self.prefill_chunk
        for seq in self.running:
            if budget == 0:
                break
            if seq.prefill_done:
                continue
            n = min(budget, len(seq.prompt) - seq.cached)
            n = self._cut(seq, n) if self._cut else n
            chunks.append(Chunk(seq, n))
            budget -= n
            if seq.cached + n == len(seq.prompt) and seq.request.max_tokens > 0:
                sampled.append(seq)
        return Batch(decode, chunks, sampled), ended

    def arrival_wait(self, now: float, preparing: int) -> float:
        """Seconds the queued requests should wait for `preparing` requests still on their way
        from the front end (as of its last hand-over), so that a burst's prompts share one
        prompt step: only while a request is queued, the queued prompts leave room in the
        step's prompt budget, and until `ARRIVAL_WINDOW_S` past the newest queued request's
        hand-over (`Sequence.handed`), at most `GATHER_LIMIT_S` past the
        oldest's arrival. 0: admit them now. (Decoding rows are not held up: their steps run
        meanwhile, `StepPrepare._gather`.)"""
        if preparing <= 0:
            return 0.0
        with self._lock:
            if not self.pending:
                return 0.0
            oldest = min(seq.arrived for seq in self.pending)
            newest = max(seq.handed for seq in self.pending)
            queued = sum(len(seq.prompt) for seq in self.pending)
        queued += sum(len(seq.prompt) - seq.cached for seq in self.running)
        if queued >= self.prefill_chunk:
            return 0.0
        return max(0.0, min(newest + ARRIVAL_WINDOW_S, oldest + GATHER_LIMIT_S) - now)

    def may_admit(self, now: float, preparing: int = 0) -> bool:
        """A schedule now could change the queue: a request is queued, a running place is
        free, the head is not the one that waited for pages at the last schedule (pages come
        back when a request ends, and the step that retires it schedules again) and its burst
        is not still arriving (`arrival_wait`) — or the head was cancelled or waited past its
        timeout."""
        pending = self.pending
        if not pending:
            return False
        head = pending[0]
        if head.cancelled or self._expired(head, now):
            return True
        return (len(self.running) < self.max_running and head is not self._waiting
                and self.arrival_wait(now, preparing) <= 0)

    def _expired(self, seq: Sequence, now: float) -> bool:
        return now - seq.arrived > self.pending_timeout_s

    def _end_unscheduled(self, seq: Sequence) -> None:
        if seq.cancelled:
            seq.cancel()
        else:
            seq.fail(EngineError(
                f"request was not admitted within {self.pending_timeout_s:g} s",
                "request_queue_timeout", 503))

    def _try_admit(self, seq: Sequence, now: float) -> bool | None:
        """True: admitted; False: failed; None: must wait for memory."""
        try:
            if not self._admit(seq):
                return None
        except RequestError as exc:
            seq.fail(exc.error)
            return False
        except MemoryError as exc:  # no memory for its cache: this request only
            seq.fail(EngineError(f"cannot admit the request: {exc}", "kv_exhausted", 503))
            return False
        except Exception as exc:  # a fault of this request's admission: not the engine's
            seq.fail(EngineError(f"cannot admit the request: {type(exc).__name__}: {exc}"))
            return False
        seq.admitted = now
        # An empty event marks admission: the HTTP layer sends SSE headers now, not at token 1.
        seq.emit(TokenEvent(usage=Usage(len(seq.prompt), 0, min(seq.cached, len(seq.prompt)))))
        return True

    def queued(self) -> list[Sequence]:
        with self._lock:
            return list(self.pending)

    def remove(self, seq: Sequence) -> None:
        """Forget a finished sequence (the engine gives back its memory)."""
        if seq in self.running:
            self.running.remove(seq)

    def drain(self) -> list[Sequence]:
        """Take every queued and running sequence out (engine failure or shutdown)."""
        with self._lock:
            self._closed = True
            everything = [*self.running, *self.pending]
            self.pending.clear()
        self.running = []
        return everything
