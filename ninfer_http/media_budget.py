"""`--media-live-mib`: the decoded media that requests in flight hold, bounded.

A request's decoded items (their patch arrays) are counted from the moment they are decoded
until its HTTP handler returns. A request whose own media is larger than the whole budget is
400 `media_budget_exceeded`; one that would overflow what others hold waits, first come first
served, up to `--pending-timeout-ms`, then 503 `request_queue_timeout` (Anthropic 504), as a
queued request does (contract §3, §4). 0 = no budget.
"""
from __future__ import annotations

import asyncio
from collections import deque

from aiohttp import web

from .errors import ApiError

MIB = 1024 * 1024


class MediaBudget:
    """Bytes of decoded media held by requests in flight, at most `capacity` (0: unbounded)."""

    def __init__(self, capacity: int, timeout_s: float) -> None:
        self.capacity, self.timeout_s = capacity, timeout_s
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    async def acquire(self, nbytes: int) -> None:
        """Hold `nbytes` (give them back with `release`), waiting for others to release."""
        if not self.capacity or not nbytes:
            return
        if nbytes > self.capacity:
            raise ApiError(400, f"This request's media take {nbytes / MIB:.1f} MiB decoded, more "
                           f"than the server's live media budget of {self.capacity // MIB} MiB "
                           "(--media-live-mib).", "media_budget_exceeded", param="messages")
        if not self._waiters and self.used + nbytes <= self.capacity:
            self.used += nbytes
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (nbytes, granted)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(granted, self.timeout_s)
        except BaseException as exc:  # timed out or cancelled: give up the place or the bytes
            if granted.done() and not granted.cancelled():
                self.release(nbytes)  # granted just as we gave up
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._grant()  # the ones behind may fit now
            if isinstance(exc, asyncio.TimeoutError):
                raise ApiError(503, "The request's media waited longer than the queue timeout "
                               "for the live media budget (--media-live-mib).",
                               "request_queue_timeout") from None
            raise

    def release(self, nbytes: int) -> None:
        if not self.capacity or not nbytes:
            return
        self.used -= nbytes
        self._grant()

    def _grant(self) -> None:
        """Wake waiters in arrival order while the first of them fits."""
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            nbytes, granted = self._waiters.popleft()
            if not granted.done():
                self.used += nbytes
                granted.set_result(None)


BUDGET = web.AppKey("media_budget", MediaBudget)
_HELD = web.RequestKey("ninfer_media_held", int)  # bytes held until the handler returns


async def hold(request: web.Request, nbytes: int) -> None:
    """Hold `nbytes` of the app's budget for the rest of `request`'s handler."""
    await request.app[BUDGET].acquire(nbytes)
    request[_HELD] = request.get(_HELD, 0) + nbytes


@web.middleware
async def release_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Give back what the request held, however its handler ends (a stream's last byte is
    written inside it)."""
    try:
        return await handler(request)
    finally:
        held = request.get(_HELD, 0)
        if held:
            request.app[BUDGET].release(held)
