"""`--media-live-mib` (`media_budget.MediaBudget`): a request larger than the budget is 400, one
that would overflow waits in arrival order for releases, and a waiter that times out or is
cancelled gives its place (or its just-granted bytes) back."""
from __future__ import annotations

import asyncio

import pytest

from ninfer_http.errors import ApiError
from ninfer_http.media_budget import MediaBudget


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))  # bounded: a lost wake-up fails, not hangs


def test_media_larger_than_the_budget_is_refused_at_once():
    async def go():
        budget = MediaBudget(100, timeout_s=5)
        with pytest.raises(ApiError) as err:
            await budget.acquire(101)
        assert (err.value.status, err.value.code) == (400, "media_budget_exceeded")
        await budget.acquire(100)  # exactly the budget fits
        assert budget.used == 100
    run(go())


def test_waiters_are_granted_in_arrival_order_as_bytes_come_back():
    async def go():
        budget, order = MediaBudget(100, timeout_s=5), []
        await budget.acquire(70)

        async def want(name, nbytes):
            await budget.acquire(nbytes)
            order.append(name)
        big = asyncio.create_task(want("big", 60))
        await asyncio.sleep(0)
        small = asyncio.create_task(want("small", 10))  # would fit now, but queues behind big
        await asyncio.sleep(0.05)
        assert order == [] and budget.used == 70
        budget.release(70)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and budget.used == 70
    run(go())


def test_a_waiter_that_times_out_is_503_and_lets_the_next_one_in():
    async def go():
        budget = MediaBudget(100, timeout_s=0.05)
        await budget.acquire(50)
        with pytest.raises(ApiError) as err:
            await budget.acquire(80)  # never fits while the 50 are held
        assert (err.value.status, err.value.code) == (503, "request_queue_timeout")
        await budget.acquire(50)  # no stale waiter blocks the queue
        assert budget.used == 100
    run(go())


def test_a_cancelled_waiter_leaves_no_bytes_and_no_place_behind():
    async def go():
        budget = MediaBudget(100, timeout_s=5)
        await budget.acquire(90)
        waiter = asyncio.create_task(budget.acquire(50))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        budget.release(90)
        assert budget.used == 0
        await budget.acquire(100)
    run(go())


def test_no_budget_holds_nothing():
    async def go():
        budget = MediaBudget(0, timeout_s=5)
        await budget.acquire(10**12)
        budget.release(10**12)
        assert budget.used == 0
    run(go())
