"""When the request being served arrived, and the client label it carried.

The front end (ninfer_http's observation middleware) sets `Arrival` once per HTTP request, in a
context variable, before anything else runs for it; the supervisor and the engine read it in
`submit()`, which runs in that request's context. So queue wait, TTFT and end-to-end latency are
all counted from the same instant, the one a client would measure from, wherever they are shown.

A generation request also holds a place in the front end's `Preparing` count from its arrival
until `submit()` hands it over (or it ends first): the engine learns, with each hand-over, how
many requests were still being prepared then, so a prompt step can wait briefly for the rest of
a burst (`StepPrepare._gather`).
"""
from __future__ import annotations

import contextvars
import threading
import time
from dataclasses import dataclass


class Preparing:
    """The generation requests the front end has received and not yet handed to the engine
    (body, chat template, tokenization: ~1-5 ms each, several at once in a burst)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def hold(self) -> "Hold":
        """A place for one arriving request, until its `Hold.release()`."""
        with self._lock:
            self.count += 1
        return Hold(self)

    def _leave(self) -> None:
        with self._lock:
            self.count -= 1


class Hold:
    """One request's place in `Preparing`; `release()` gives it back once (the hand-over to
    the engine, the admission gate, or the request's end, whichever comes first) and returns
    how many requests are still being prepared."""

    def __init__(self, preparing: Preparing) -> None:
        self._preparing = preparing
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> int:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._preparing._leave()
        return self._preparing.count


@dataclass(frozen=True)
class Arrival:
    at: float  # time.monotonic()
    client: str | None = None  # X-Ninfer-Client label
    hold: Hold | None = None  # a generation request's place in the front end's `Preparing`

    def hand_over(self) -> int:
        """At `submit()` (or the admission gate): the request leaves `Preparing`; how many
        others it still holds."""
        return self.hold.release() if self.hold is not None else 0


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
