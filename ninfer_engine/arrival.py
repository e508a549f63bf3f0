"""When the request being served arrived, and the client label it carried.

The front end (ninfer_http's observation middleware) sets `Arrival` once per HTTP request, in a
context variable, before anything else runs for it; the supervisor and the engine read it in
`submit()`, which runs in that request's context. So queue wait, TTFT and end-to-end latency are
all counted from the same instant, the one a client would measure from, wherever they are shown.
"""
from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    at: float  # time.monotonic()
    client: str | None = None  # X-Ninfer-Client label


_CURRENT: contextvars.ContextVar[Arrival | None] = contextvars.ContextVar("ninfer_arrival",
                                                                          default=None)


def set_arrival(arrival: Arrival) -> contextvars.Token:
    """Mark the current context's request; give the token to `reset_arrival` when it ends."""
    return _CURRENT.set(arrival)


def reset_arrival(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


def current_arrival() -> Arrival:
    """The current request's arrival; a submit outside any HTTP request arrives now."""
    return _CURRENT.get() or Arrival(time.monotonic())
