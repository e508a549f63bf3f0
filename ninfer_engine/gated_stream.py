"""`GatedStream`: the event stream `Supervisor.submit` returns.

Its first read waits at the supervisor's admission gate, then it reads the current engine's
stream; the request's end (its finishing event, a refusal at the gate, or an early close) is
recorded in the supervisor's ledger.
"""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from .arrival import current_arrival
from .request_ledger import ended_view
from .step.event_pump import EventStream, IteratorStream, as_event_stream
from .types import GenerationRequest, TokenEvent, Timings, Usage

if TYPE_CHECKING:  # for the annotation only: `supervisor` imports this module
    from .supervisor import Supervisor


class GatedStream:
    """`Supervisor.submit`'s event stream: the first read waits at the admission gate, then
    reads the current engine's stream (`EventStream`'s `wait`, `take`, `aclose`, and async
    iteration); the finishing event, or an early close, is recorded in the ledger."""

    def __init__(self, supervisor: Supervisor, request: GenerationRequest) -> None:
        self._supervisor, self._request = supervisor, request
        self._arrival = current_arrival()
        self._arrival.hand_over()  # prepared: waiting at the gate is not the front end's work
        self._events: EventStream | IteratorStream | None = None  # once past the gate
        self._recorded = False
        self._held: deque[TokenEvent] = deque()  # taken, not yet iterated
        self._read_last = False

    async def _enter(self) -> EventStream | IteratorStream:
        if self._events is None:
            sup, arrival, rid = self._supervisor, self._arrival, self._request.request_id
            prompt = len(self._request.prompt_ids)
            deadline = arrival.at + sup.config.pending_timeout_ms / 1000
            refused = await sup.gate.enter(rid, prompt, arrival.at, arrival.client, deadline)
            if refused is not None:
                last = TokenEvent(finish="error", error=refused, usage=Usage(prompt, 0),
                                  timings=Timings(queue_s=time.monotonic() - arrival.at))
                self._recorded = True  # the gate's refusal: no client, no cut-off
                sup.ledger.record(ended_view(rid, prompt, arrival.at, arrival.client, last,
                                             time.monotonic()))
                self._events = EventStream.of(last)
            else:
                sup._clients[rid] = arrival.client
                self._events = as_event_stream(sup._current().submit(self._request))
        return self._events

    async def wait(self, timeout: float | None = None) -> bool:
        """The first call also waits at the gate (without the timeout)."""
        return await (await self._enter()).wait(timeout)

    def take(self) -> list[TokenEvent]:
        events = [] if self._events is None else self._events.take()
        if events and events[-1].finish is not None:
            self._end(events[-1])
        return events

    def __aiter__(self) -> GatedStream:
        return self

    async def __anext__(self) -> TokenEvent:
        while not self._held:
            if self._read_last:
                raise StopAsyncIteration
            await self.wait()
            self._held.extend(self.take())
        event = self._held.popleft()
        self._read_last = event.finish is not None
        return event

    async def aclose(self) -> None:
        """An early close reaches the engine now, so it cancels at the next step."""
        if self._events is not None:
            self._end(None)
            await self._events.aclose()

    def _end(self, last: TokenEvent | None) -> None:
        if not self._recorded:
            self._recorded = True
            sup, arrival, rid = self._supervisor, self._arrival, self._request.request_id
            sup._clients.pop(rid, None)
            sup._record(rid, len(self._request.prompt_ids), arrival.at, arrival.client, last)
