"""Token events from the engine thread to the asyncio loops of the requests' readers.

The engine makes a step's events on its own thread; each reader waits on an `asyncio.Queue`
of its loop. Handing each event over with `loop.call_soon_threadsafe` wakes the loop (a write
to its self-pipe) once per token per request; `EventPump` collects a step's events and hands
them over once per loop when the step ends (`flush`), so a batch of B rows costs one wakeup,
not B, and the loop delivers them in one callback.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


class EventPump:
    """`emitter(loop, queue)` gives a request's emit function; `flush()` hands over what was
    emitted since the last flush (call it after every step and after failing requests)."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        self._lock = threading.Lock()

    def emitter(self, loop: asyncio.AbstractEventLoop,
                queue: asyncio.Queue) -> Callable[[Any], None]:
        def emit(event: Any) -> None:
            with self._lock:
                self._pending.setdefault(loop, []).append((queue, event))
        return emit

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that loop is closed: nobody is listening
                pass
