"""`EventPump`: a step's events reach each reader's loop in order, in one callback per loop."""
from __future__ import annotations

import asyncio
import threading

from ninfer_engine.step.event_pump import EventPump


def test_events_wait_for_the_flush_and_arrive_in_order_once_per_loop():
    pump = EventPump()

    async def main():
        loop = asyncio.get_running_loop()
        a, b = asyncio.Queue(), asyncio.Queue()
        emit_a, emit_b = pump.emitter(loop, a), pump.emitter(loop, b)
        wakeups = []
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wakeups.append(1) or original(*args)

        def engine_step():  # another thread, as the engine's
            for i in range(3):
                emit_a(("a", i))
                emit_b(("b", i))
        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()
        await asyncio.sleep(0)
        assert a.empty() and b.empty() and not wakeups  # nothing before the flush
        pump.flush()
        got_a = [await asyncio.wait_for(a.get(), 1) for _ in range(3)]
        got_b = [await asyncio.wait_for(b.get(), 1) for _ in range(3)]
        assert got_a == [("a", i) for i in range(3)] and got_b == [("b", i) for i in range(3)]
        assert wakeups == [1]
        pump.flush()  # nothing pending: no wakeup
        assert wakeups == [1]
        return loop, a

    loop, queue = asyncio.run(main())
    pump.emitter(loop, queue)("late")  # the loop is closed now: dropped, no error
    pump.flush()
