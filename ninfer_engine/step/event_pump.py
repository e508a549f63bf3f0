"""Token events from the engine thread to the asyncio loops of the requests' readers.

The engine makes a step's events on its own thread; each reader owns an `EventStream` on its
loop. Handing each event over with `loop.call_soon_threadsafe` wakes the loop (a write to its
self-pipe) once per token per request; `EventPump` collects a step's events and hands them
over once per loop when the step ends (`flush`), so a batch of B rows costs one wakeup, not B,
and the loop delivers them in one callback.

A reader that falls behind (its loop busy with the other streams) finds several events in its
stream and takes them at once (`EventStream.take`, as vLLM v1's `RequestOutputCollector`
does), so it can write them in one send: under load the per-token work of the HTTP side
shrinks instead of the queue growing.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..types import TokenEvent


class EventStream:
    """One request's events on its reader's loop; what `Engine.submit` returns.

    An async iterator of `TokenEvent` (the last one carries `finish`); a reader that can use
    several at once calls `wait(timeout)` and then `take()`. Closing it (`aclose`) before the
    finishing event calls `on_close`, which the engine sets to cancel the request."""

    def __init__(self) -> None:
        self._ready: deque[TokenEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.on_close: Callable[[], None] | None = None
        self._finished = False  # the finishing event was put
        self._taken_last = False  # ... and taken

    @classmethod
    def of(cls, event: TokenEvent) -> EventStream:
        """A stream of one (finishing) event: a request refused before it was queued."""
        stream = cls()
        stream.put(event)
        return stream

    def put(self, event: TokenEvent) -> None:
        """Add an event (on the reader's loop)."""
        self._ready.append(event)
        self._finished = self._finished or event.finish is not None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[TokenEvent]:
        """Every event that arrived and was not taken yet, in order (maybe none)."""
        events = list(self._ready)
        self._ready.clear()
        if events and events[-1].finish is not None:
            self._taken_last = True
        return events

    async def wait(self, timeout: float | None = None) -> bool:
        """Until an event is ready to take (True) or `timeout` seconds pass (False). A reader
        cancelled here is gone, as from an async generator: the stream closes."""
        if not self._ready:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                self._close()
                raise
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        return bool(self._ready)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._taken_last:
            raise StopAsyncIteration
        while not self._ready:
            await self.wait()
        event = self._ready.popleft()
        self._taken_last = event.finish is not None
        return event

    async def aclose(self) -> None:
        """Stop reading; a request that has not finished is cancelled."""
        self._close()

    def _close(self) -> None:
        if not self._finished and self.on_close is not None:
            self.on_close()
        self._finished = self._taken_last = True
        self.on_close = None


class IteratorStream:
    """`EventStream`'s reading side (`wait`, `take`, `aclose`) over any async iterator of
    events: an engine whose `submit` is an async generator (test doubles, wrappers).
    The iterator's own exceptions, `StopAsyncIteration` included, come out of `wait`."""

    def __init__(self, events: AsyncIterator[TokenEvent]) -> None:
        self._events = events.__aiter__()
        self._next: asyncio.Task[TokenEvent] | None = None  # survives a `wait` that timed out
        self._ready: list[TokenEvent] = []

    async def wait(self, timeout: float | None = None) -> bool:
        if self._ready:
            return True
        if self._next is None:
            self._next = asyncio.ensure_future(self._events.__anext__())
        done, _ = await asyncio.wait({self._next}, timeout=timeout)
        if not done:
            return False
        task, self._next = self._next, None
        self._ready.append(task.result())
        return True

    def take(self) -> list[TokenEvent]:
        events, self._ready = self._ready, []
        return events

    async def aclose(self) -> None:
        if self._next is not None:
            self._next.cancel()
            await asyncio.wait({self._next})  # an iterator cannot close while its step runs
            self._next = None
        close = getattr(self._events, "aclose", None)
        if close is not None:
            await close()


def as_event_stream(events: Any) -> EventStream | IteratorStream:
    """`events` itself when it is an `EventStream` (or reads like one), else wrapped."""
    return events if hasattr(events, "take") else IteratorStream(events)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _deliver(items: list[tuple[EventStream, Any]]) -> None:
    for stream, event in items:
        stream.put(event)


class EventPump:
    """`emitter(loop, stream)` gives a request's emit function; `flush()` hands over what was
    emitted since the last flush (call it after every step and after failing requests)."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[EventStream, Any]]] = {}
        self._lock = threading.Lock()

    def emitter(self, loop: asyncio.AbstractEventLoop,
                stream: EventStream) -> Callable[[Any], None]:
        def emit(event: Any) -> None:
            with self._lock:
                self._pending.setdefault(loop, []).append((stream, event))
        return emit

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        hand_over(pending)


def hand_over(pending: dict[asyncio.AbstractEventLoop, list[tuple[EventStream, Any]]]) -> None:
    """Each loop's (stream, event) pairs put in their streams by one callback on that loop."""
    for loop, items in pending.items():
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # that loop is closed: nobody is listening
            pass
