"""The one SSE loop every protocol streams through (contract §2 "SSE").

`serve_stream(request, generation, protocol)` admits the generation (failures before this point
are plain HTTP errors), opens the event stream, lets the protocol write its opening events,
feeds it every engine event with an SSE keep-alive comment whenever `KEEPALIVE_S` passes
without one, lets it write its closing events, and turns a failure after the headers into the
protocol's in-band error event. A client that goes away cancels the generation.

The events of the engine events that arrived together are sent in one write: a stream keeps
up token by token while the server has time, and sends in bursts when it falls behind.
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

    async def open(self, response: sse.EventWriter, first: TokenEvent) -> None:
        """The opening events, given the engine's admission event."""

    async def feed(self, response: sse.EventWriter, event: TokenEvent) -> None:
        """The events of one engine event (the finishing one included)."""

    async def close(self, response: sse.EventWriter) -> None:
        """The closing events; `generation.last` is the finishing engine event."""

    def failure(self, error: ApiError) -> bytes:
        """The in-band error event for a failure after the headers went out."""


async def serve_stream(request: web.Request, generation: Generation,
                       protocol: StreamProtocol) -> web.StreamResponse:
    first = await generation.admit()
    response = await sse.open_stream(request)
    out = sse.BufferedStream(response)
    try:
        await protocol.open(out, first)
        async for event in generation.follow(first, request.app[KEEPALIVE_S]):
            if event is None:
                await out.write(sse.KEEPALIVE)
            else:
                await protocol.feed(out, event)
            # what arrived meanwhile joins this write; the last events leave with the close
            if (event is None or event.finish is None) and not generation.ready():
                await out.flush()
        await protocol.close(out)
        await out.flush()
    except ConnectionResetError:
        generation.disconnected()
    except Exception:
        error = generation.broken()
        with contextlib.suppress(ConnectionResetError):
            await out.flush()  # the whole events written before the failure
            await response.write(protocol.failure(error))
    return response
