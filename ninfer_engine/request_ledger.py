"""`RequestLedger`: every request's end, as the supervisor saw it, for the latency block.

The supervisor records each request that went through `submit()` when its last event passes
(or when its consumer went away without one), and the front end records the requests it
refused before they reached the engine (429 `server_overloaded`, 503 while not ready). The
ledger belongs to the supervisor, so its window, its recent list and its totals outlive reloads.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from dataclasses import replace
from typing import Callable

from .stats import SUCCESS, LatencyStats, Percentiles, RequestView, time_to_first_token
from .types import TokenEvent

WINDOW_S = 60.0
RECENT = 32
CLIENT_GONE = "client_disconnected"


def percentiles(values: list[float]) -> Percentiles:
    """Nearest-rank p50/p95/p99 of `values` (all zero when empty)."""
    if not values:
        return Percentiles()
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered), max(1, math.ceil(len(ordered) * q))) - 1]

    return Percentiles(rank(0.50), rank(0.95), rank(0.99), len(ordered))


def outcome_of(view: RequestView) -> str:
    """The label a request's end is counted under: its finish reason or its error code."""
    if view.phase in SUCCESS or view.phase == "cancelled":
        return view.phase
    return view.reason or view.phase


def ended_view(request_id: str, prompt_tokens: int, arrived: float, client: str | None,
               last: TokenEvent | None, now: float) -> RequestView:
    """The `RequestView` of a request whose last event is `last` (None: its client left)."""
    if last is None:
        return RequestView(request_id, "cancelled", prompt_tokens, reason=CLIENT_GONE,
                           client=client, waited_s=now - arrived, e2e_s=now - arrived)
    usage, timings = last.usage, last.timings
    output = usage.completion_tokens if usage else 0
    queue_s = timings.queue_s if timings else now - arrived
    ttft = time_to_first_token(timings, output) if timings is not None else None
    tok_s = 0.0
    if timings is not None and timings.decode_s > 0 and output > 1:
        tok_s = (output - 1) / timings.decode_s
    e2e = None
    if ttft is not None and timings is not None:
        e2e = ttft + timings.decode_s
    return RequestView(
        request_id, last.finish or "error", usage.prompt_tokens if usage else prompt_tokens,
        output, tok_s, ttft, queue_s, usage.cached_tokens if usage else 0,
        last.error.code if last.error else None, client, e2e)


class RequestLedger:
    """Thread-safe: written on the server's event loop, read by every observer."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window: deque[tuple[float, RequestView]] = deque()
        self._recent: deque[RequestView] = deque(maxlen=RECENT)
        self._totals: Counter[str] = Counter()

    def record(self, view: RequestView) -> None:
        """One request ended (`view.phase` is its end)."""
        now = self._clock()
        with self._lock:
            self._window.append((now, view))
            self._recent.append(view)
            self._totals[outcome_of(view)] += 1
            self._expire(now)

    def rejected(self, request_id: str, code: str | None, client: str | None,
                 waited_s: float = 0.0) -> None:
        """A request the front end refused before the engine saw it."""
        self.record(RequestView(request_id, "rejected", reason=code or "error", client=client,
                                waited_s=waited_s))

    def _expire(self, now: float) -> None:
        while self._window and now - self._window[0][0] > self.window_s:
            self._window.popleft()

    def recent(self) -> tuple[RequestView, ...]:
        with self._lock:
            return tuple(self._recent)

    def latency(self) -> LatencyStats:
        now = self._clock()
        with self._lock:
            self._expire(now)
            views = [view for _, view in self._window]
            totals = tuple(sorted(self._totals.items()))
            first = self._window[0][0] if self._window else now
        served = [v for v in views if v.phase in SUCCESS]
        itl = [(v.e2e_s - v.ttft_s) / (v.output_tokens - 1) for v in served
               if v.e2e_s is not None and v.ttft_s is not None and v.output_tokens > 1]
        span = min(self.window_s, max(now - first, 1.0))  # a young window is not a full minute
        return LatencyStats(
            window_s=self.window_s, requests=len(views), rate_per_s=len(views) / span,
            ttft=percentiles([v.ttft_s for v in served if v.ttft_s is not None]),
            itl=percentiles(itl),
            e2e=percentiles([v.e2e_s for v in served if v.e2e_s is not None]),
            queue=percentiles([v.waited_s for v in views if v.phase != "rejected"]),
            outcomes=tuple(sorted(Counter(outcome_of(v) for v in views).items())),
            totals=totals,
        )


def with_client(view: RequestView, clients: dict[str, str | None]) -> RequestView:
    client = clients.get(view.id)
    return replace(view, client=client) if client and view.client is None else view
