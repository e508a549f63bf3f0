"""Lifetime slots (contract §4): C + P slots cover a generation from preparation to its last byte.

C is `--max-concurrency` (running in the engine), P is `--max-pending-requests` (waiting in its
FIFO queue). A request takes a slot right after preparation (preparation is synchronous, so no
other request runs in between) and holds it through queueing, generation and the last byte of
its response. With every slot taken it is rejected at once, before any SSE header: 429
`server_overloaded` (Anthropic 529 `overloaded_error`). Holding a slot for the whole lifetime
bounds the engine queue by P without asking the engine.

The queue deadline (`--pending-timeout-ms`, 503 `request_queue_timeout`, Anthropic 504) is the
engine's: only it knows when a request is admitted, and it marks that with an empty event.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from aiohttp import web

from ninfer_engine.config import EngineConfig

from .errors import ApiError
from .logs import RequestTrace


class LifetimeSlots:
    """A counter of the C + P slots; used only on the server's event loop, so it needs no lock."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0

    @classmethod
    def for_config(cls, config: EngineConfig) -> LifetimeSlots:
        return cls(config.max_concurrency + config.max_pending_requests)

    @contextlib.contextmanager
    def hold(self, trace: RequestTrace) -> Iterator[None]:
        """Hold one slot for the body of the `with`; none free is a logged 429 at once."""
        if self.in_use >= self.capacity:
            error = overloaded(self.capacity)
            trace.ended("rejected", "queue", error.status, error.code)
            raise error
        self.in_use += 1
        try:
            yield
        finally:
            self.in_use -= 1


SLOTS = web.AppKey("ninfer_lifetime_slots", LifetimeSlots)


def overloaded(capacity: int) -> ApiError:
    """429 `rate_limit_error` / `server_overloaded`; the Anthropic shape makes it 529."""
    return ApiError(429, f"The server is overloaded: all {capacity} request slots "
                         "(running and queued) are taken. Retry later.", "server_overloaded")
