"""Server-sent events framing (contract §2 "SSE")."""
from __future__ import annotations

import json
from typing import Any, Protocol

from aiohttp import web

HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Send the SSE status line and headers; nothing may fail as plain HTTP after this."""
    response = web.StreamResponse(status=200, headers=HEADERS)
    await response.prepare(request)
    return response


def data(payload: Any) -> bytes:
    """One `data:` event (OpenAI Chat style)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def event(name: str, payload: Any) -> bytes:
    """One named event (Anthropic and Responses style)."""
    body = json.dumps(payload, ensure_ascii=False).encode()
    return b"event: " + name.encode() + b"\ndata: " + body + b"\n\n"


class EventWriter(Protocol):
    """Where a protocol writes its events: a `web.StreamResponse`, or a `BufferedStream`."""

    async def write(self, data: bytes) -> None: ...


class BufferedStream:
    """A stream response whose writes wait for `flush`, which sends them as one write: the
    events of several tokens that arrived together leave in one send (one syscall, one
    handover of the GIL) instead of one each."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self._parts: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self._parts.append(data)

    async def flush(self) -> None:
        if self._parts:
            data = b"".join(self._parts)
            self._parts.clear()
            await self.response.write(data)
