"""One submitted generation: engine events in, protocol-neutral output channels out.

`Generation` owns the engine's event stream and the request's log trace: it waits with a
timeout (for SSE keep-alives), says whether more events already arrived (a streaming reader
behind the engine sends them in one write), tracks the phase, turns engine exceptions into
error events, writes exactly one terminal log line and closes the stream (which cancels the
request) however the handler exits. An `OutputSplitter` (see `output.py`, re-exported here)
sits between the engine text and the protocol: it splits reasoning, answer content and tool
calls.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import AsyncIterator

from ninfer_engine.client import ServingEngine
from ninfer_engine.step.event_pump import as_event_stream
from ninfer_engine.types import EngineError, Timings, TokenEvent, Usage

from .admission import LifetimeSlots
from .errors import ApiError, from_engine_error, internal_error
from .logs import RequestTrace
from .output import OutputDelta, OutputSplitter, ParsedToolCall, output_splitter
from .prompt import PreparedRequest

__all__ = ["Generation", "OutputDelta", "OutputSplitter", "ParsedToolCall", "is_failure",
           "start_generation"]

log = logging.getLogger("ninfer.http")


def _failure(message: str) -> TokenEvent:
    return TokenEvent(finish="error", error=EngineError(message, "internal_error", 500))


def is_failure(event: TokenEvent) -> bool:
    return event.finish in ("error", "cancelled")


class Generation:
    """One prepared request in the engine; use through `start_generation`."""

    def __init__(self, engine: ServingEngine, prepared: PreparedRequest, trace: RequestTrace):
        self.prepared = prepared
        self.trace = trace
        self.splitter: OutputSplitter = output_splitter(prepared)
        self.output_tokens = 0
        self.reasoning_tokens = 0  # output tokens that arrived while the splitter was in reasoning
        self.answer_start = 0  # output tokens up to the last that arrived inside the reasoning
        self.phase = "queue"  # -> "prefill" after the first event, "decode" after the first token
        self._phase_before_last = "queue"
        self.admitted_at: float | None = None  # when the first event arrived
        self.event_at: float | None = None  # when the latest event arrived
        self.first_output_at: float | None = None
        self._timings: Timings | None = None  # the latest the engine sent (running, then final)
        self._ready: deque[TokenEvent] = deque()  # taken from the stream, not yet returned
        self.last: TokenEvent | None = None  # the finishing event, once `follow` reached it
        try:
            self._events = as_event_stream(engine.submit(prepared.generation))
        except Exception:
            log.exception("engine.submit failed")
            trace.ended("failed", "queue", 500, "internal_error")
            raise internal_error() from None

    async def _fill(self, timeout: float | None) -> bool:
        """Take what arrived, waiting up to `timeout` for something; False: nothing came."""
        try:
            if not await self._events.wait(timeout):
                return False
            self._ready.extend(self._events.take())
        except StopAsyncIteration:
            self._ready.append(_failure("The engine ended the request without a finish event."))
        except Exception:
            log.exception("engine event stream failed")
            self._ready.append(_failure("The engine failed while serving this request."))
        return True

    async def next(self, timeout: float | None = None) -> TokenEvent | None:
        """The next event, or None when `timeout` seconds pass without one."""
        if not self._ready and not await self._fill(timeout):
            return None
        event = self._ready.popleft()
        self._observe(event)
        return event

    def ready(self) -> bool:
        """Another event already arrived: `next` returns it without waiting."""
        if not self._ready:
            self._ready.extend(self._events.take())
        return bool(self._ready)

    async def admit(self) -> TokenEvent:
        """The first event (the engine's admission event, or the first output of an engine that
        sends none); a failure before it is raised as a plain HTTP error."""
        event = await self.next()
        assert event is not None  # no timeout was given
        if is_failure(event) and not event.text:
            raise self.conclude(event) or internal_error()
        return event

    async def follow(self, first: TokenEvent, keepalive_s: float
                     ) -> AsyncIterator[TokenEvent | None]:
        """Yield `first` and every later event up to the finishing one (kept as `self.last`),
        and None whenever `keepalive_s` passes without one (time for an SSE keep-alive)."""
        event: TokenEvent | None = first
        while True:
            yield event
            if event is not None and event.finish is not None:
                self.last = event
                return
            event = await self.next(keepalive_s)

    async def collect(self) -> tuple[list[OutputDelta], TokenEvent]:
        """Run a non-streaming generation to its end: every split output delta and the final
        event. A failure is raised as the protocol's HTTP error."""
        event = await self.admit()
        deltas = self.splitter.feed(event.text)
        while event.finish is None:
            event = await self.next()
            assert event is not None  # no timeout was given
            deltas += self.splitter.feed(event.text)
        deltas += self.flush(event)
        error = self.conclude(event)
        if error is not None:
            raise error
        return deltas, event

    def flush(self, last: TokenEvent | None) -> list[OutputDelta]:
        """The splitter's held-back output once `last` ended the generation: a tool call the
        token limit cut before it closed comes back as text (contract: `length` wins)."""
        return self.splitter.flush(truncated=last is not None and last.finish == "length")

    def _observe(self, event: TokenEvent) -> None:
        self.event_at = now = time.monotonic()
        self._phase_before_last = self.phase
        self.output_tokens += len(event.token_ids)
        # Runs before the protocol feeds this event's text: the state is the one it starts in.
        if self.splitter.in_reasoning:
            self.reasoning_tokens += len(event.token_ids)
            self.answer_start = self.output_tokens
        if event.timings is not None:
            self._timings = event.timings
        if self.phase == "queue":
            self.phase = "prefill"
            self.admitted_at = now
        if self.phase == "prefill" and (event.text or event.token_ids):
            self.phase = "decode"
            self.first_output_at = now

    def since_admission_ms(self) -> float:
        """Milliseconds from the first event to the latest one (`prompt_progress.time_ms`)."""
        if self.admitted_at is None or self.event_at is None:
            return 0.0
        return (self.event_at - self.admitted_at) * 1000.0

    def running_timings(self) -> Timings:
        """The timings so far (Chat's `timings_per_token`): the engine's latest, else counts."""
        return self._timings or Timings(predicted_n=self.output_tokens)

    def accounting(self, last: TokenEvent) -> tuple[Usage, Timings]:
        """Usage and timings of the finished request (counted here if the engine sent none)."""
        usage = last.usage or Usage(self.prepared.prompt_tokens, self.output_tokens)
        return usage, last.timings or Timings(predicted_n=usage.completion_tokens)

    def conclude(self, last: TokenEvent) -> ApiError | None:
        """Log the terminal line for the final event; the error to report if it failed."""
        if not is_failure(last):
            usage, timings = self.accounting(last)
            self.trace.done(last.finish or "stop", last.stop_sequence, usage, timings,
                            self.first_output_at)
            return None
        if last.finish == "cancelled":
            error = ApiError(503, "The server cancelled this request.", "service_unavailable")
        else:
            error = from_engine_error(last.error)
        phase = self._phase_before_last
        self.trace.ended("rejected" if phase == "queue" else "failed", phase, error.status,
                         error.code)
        return error

    def disconnected(self) -> None:
        """The client went away: log 499 unless a terminal line was already written."""
        if not self.trace.closed:
            self.trace.ended("cancelled", self.phase, 499, "client_disconnected")

    def broken(self) -> ApiError:
        """This server failed after the response started; log it, return the in-band error."""
        log.exception("response failed after its headers were sent")
        if not self.trace.closed:
            self.trace.ended("failed", self.phase, 500, "internal_error")
        return internal_error()

    async def close(self) -> None:
        """Stop waiting and close the engine stream; an unfinished request is cancelled."""
        try:
            await self._events.aclose()
        except Exception:
            log.exception("closing the engine event stream failed")


@contextlib.asynccontextmanager
async def start_generation(
    engine: ServingEngine, prepared: PreparedRequest, trace: RequestTrace, slots: LifetimeSlots
) -> AsyncIterator[Generation]:
    """Take a lifetime slot (or raise 429) and submit `prepared`; on exit the request is closed,
    a cancelled handler logged as 499, and the slot given back."""
    with slots.hold(trace):
        generation = Generation(engine, prepared, trace)
        try:
            yield generation
        except asyncio.CancelledError:
            # aiohttp cancels the handler when its client disconnects (handler_cancellation).
            generation.disconnected()
            raise
        finally:
            await generation.close()
