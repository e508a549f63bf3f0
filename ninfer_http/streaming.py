"""The one SSE loop every protocol streams through (contract §2 "SSE").

`serve_stream(request, generation, protocol)` admits the generation (failures before this point
are plain HTTP errors), opens the event stream, lets the protocol write its opening events,
feeds it every engine event with an SSE keep-alive comment whenever `KEEPALIVE_S` passes
without one, lets it write its closing events, and turns a failure after the headers into the
protocol's in-band error event. A client that goes away cancels the generation.
"""
from __future__ import annotations

import contextlib
from typing import Protocol

from aiohttp import web

from ninfer_engine.types import TokenEvent

from . import sse
from .context import KEEPALIVE_S
from .errors import ApiError
from .generation import Generation


class StreamProtocol(Protocol):
    """How one protocol writes a generation as server-sent events."""

    async def open(self, response: web.StreamResponse, first: TokenEvent) -> None:
        """The opening events, given the engine's admission event."""

    async def feed(self, response: web.StreamResponse, event: TokenEvent) -> None:
        """The events of one engine event (the finishing one included)."""

    async def close(self, response: web.StreamResponse) -> None:
        """The closing events; `generation.last` is the finishing engine event."""

    def failure(self, error: ApiError) -> bytes:
        """The in-band error event for a failure after the headers went out."""


async def serve_stream(request: web.Request, generation: Generation,
                       protocol: StreamProtocol) -> web.StreamResponse:
    first = await generation.admit()
    response = await sse.open_stream(request)
    try:
        await protocol.open(response, first)
        async for event in generation.follow(first, request.app[KEEPALIVE_S]):
            if event is None:
                await response.write(sse.KEEPALIVE)
                continue
            await protocol.feed(response, event)
        await protocol.close(response)
    except ConnectionResetError:
        generation.disconnected()
    except Exception:
        error = generation.broken()
        with contextlib.suppress(ConnectionResetError):
            await response.write(protocol.failure(error))
    return response
