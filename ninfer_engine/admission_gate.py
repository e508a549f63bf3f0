"""`AdmissionGate`: the supervisor's front door, open, paused or draining.

While paused, new requests wait at the gate (up to the queue deadline) and stay visible in the
snapshot as "paused"; while draining (a graceful stop) the gate refuses new requests and ends
the waiting ones at once, all with 503. The operator can cancel a waiting request by id.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from .stats import RequestView
from .types import EngineError

POLL_S = 0.05
OPEN, PAUSED, DRAINING = "open", "paused", "draining"
SHUTTING_DOWN = EngineError("the server is shutting down", "service_unavailable", 503)
PAUSE_TIMEOUT = EngineError("admission is paused and the request was not admitted in time",
                            "request_queue_timeout", 503)
CANCELLED = EngineError("the operator cancelled this request", "cancelled_by_operator", 503)


@dataclass
class _Waiter:
    id: str
    prompt_tokens: int
    arrived: float
    client: str | None
    cancelled: bool = False


class AdmissionGate:
    """Used on the server's event loop, read (the `state` and `waiting()`) from anywhere."""

    def __init__(self) -> None:
        self.state = OPEN
        self._waiting: dict[str, _Waiter] = {}

    def pause(self) -> None:
        if self.state == OPEN:
            self.state = PAUSED

    def resume(self) -> None:
        if self.state == PAUSED:
            self.state = OPEN

    def close(self) -> None:
        """Drain: refuse from now on; waiting requests end at their next poll."""
        self.state = DRAINING

    async def enter(self, request_id: str, prompt_tokens: int, arrived: float,
                    client: str | None, deadline: float) -> EngineError | None:
        """Wait while paused; None once admitted to the engine, else why the request ends."""
        if self.state == DRAINING:
            return SHUTTING_DOWN
        if self.state == OPEN:
            return None
        waiter = _Waiter(request_id, prompt_tokens, arrived, client)
        self._waiting[request_id] = waiter
        try:
            while self.state == PAUSED:
                if waiter.cancelled:
                    return CANCELLED
                if time.monotonic() >= deadline:
                    return PAUSE_TIMEOUT
                await asyncio.sleep(POLL_S)
            return SHUTTING_DOWN if self.state == DRAINING else None
        finally:
            self._waiting.pop(request_id, None)

    def cancel(self, request_id: str) -> bool:
        waiter = self._waiting.get(request_id)
        if waiter is not None:
            waiter.cancelled = True
        return waiter is not None

    def waiting(self, now: float) -> tuple[RequestView, ...]:
        """The requests waiting at the gate, oldest first, in the "paused" phase."""
        return tuple(RequestView(w.id, PAUSED, w.prompt_tokens, waited_s=now - w.arrived,
                                 client=w.client)
                     for w in list(self._waiting.values()))
