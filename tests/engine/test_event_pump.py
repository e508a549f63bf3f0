"""`EventPump` and `EventStream`: a step's events reach each reader's loop in order, in one
callback per loop; a reader takes every event that arrived at once; closing or cancelling a
reader before the finishing event cancels the request."""
from __future__ import annotations

import asyncio
import threading

from ninfer_engine.step.event_pump import EventPump, EventStream, IteratorStream
from ninfer_engine.types import TokenEvent


def _events(n: int, finish: str | None = None) -> list[TokenEvent]:
    return [TokenEvent(text=str(i), finish=finish if i == n - 1 else None) for i in range(n)]


def test_events_wait_for_the_flush_and_arrive_in_order_once_per_loop():
    pump = EventPump()

    async def main():
        loop = asyncio.get_running_loop()
        a, b = EventStream(), EventStream()
        emit_a, emit_b = pump.emitter(loop, a), pump.emitter(loop, b)
        wakeups = []
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wakeups.append(1) or original(*args)

        def engine_step():  # another thread, as the engine's
            for event_a, event_b in zip(_events(3), _events(3)):
                emit_a(event_a)
                emit_b(event_b)
        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()
        await asyncio.sleep(0)
        assert not a.take() and not b.take() and not wakeups  # nothing before the flush
        pump.flush()
        assert await asyncio.wait_for(a.wait(), 1) and await asyncio.wait_for(b.wait(), 1)
        assert a.take() == _events(3) and b.take() == _events(3)  # all three at once, in order
        assert wakeups == [1]
        pump.flush()  # nothing pending: no wakeup
        assert wakeups == [1]
        return loop, a

    loop, stream = asyncio.run(main())
    pump.emitter(loop, stream)(TokenEvent(text="late"))  # the loop is closed: dropped, no error
    pump.flush()


def test_a_stream_iterates_to_its_finishing_event_and_times_out_without_one():
    async def main():
        stream = EventStream()
        assert await stream.wait(0.01) is False  # the timeout, nothing arrived
        for event in _events(3, finish="stop"):
            stream.put(event)
        return [event async for event in stream]
    assert asyncio.run(main()) == _events(3, finish="stop")


def test_closing_or_cancelling_a_reader_before_the_finish_cancels_the_request():
    async def main():
        closed = []
        early, finished, cancelled = EventStream(), EventStream(), EventStream()
        for stream, name in ((early, "early"), (finished, "finished"), (cancelled, "cancelled")):
            stream.on_close = lambda name=name: closed.append(name)
        early.put(_events(1)[0])
        await early.aclose()
        finished.put(_events(1, finish="stop")[0])
        await finished.aclose()  # the request already ended: nothing to cancel
        reader = asyncio.create_task(cancelled.wait())
        await asyncio.sleep(0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return closed
    assert asyncio.run(main()) == ["early", "cancelled"]


def test_an_async_generator_reads_as_a_stream():
    async def generator():
        for event in _events(2, finish="stop"):
            await asyncio.sleep(0)
            yield event

    async def main():
        stream = IteratorStream(generator())
        got = []
        while not got or got[-1].finish is None:
            assert await stream.wait(1)
            got += stream.take()
        await stream.aclose()
        return got
    assert asyncio.run(main()) == _events(2, finish="stop")
