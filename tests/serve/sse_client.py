"""A small Chat Completions SSE reader over aiohttp for the subprocess tests."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class ChatStream:
    """What one streamed Chat Completion delivered."""

    status: int
    content_type: str = ""
    text: str = ""
    finish: str | None = None
    error: dict[str, Any] | None = None  # the in-band `data: {"error": …}`, or a plain error body
    done: bool = False  # `data: [DONE]` arrived
    cancelled: bool = False  # the client went away on purpose
    chunks: list[dict[str, Any]] = field(default_factory=list)


async def open_chat(session: aiohttp.ClientSession, url: str,
                    body: dict[str, Any]) -> aiohttp.ClientResponse:
    return await session.post(url + "/v1/chat/completions", json=body)


async def read_chat(response: aiohttp.ClientResponse, cancel_after: int | None = None,
                    until_content: bool = False) -> ChatStream:
    """Read SSE events; stop (closing the connection) after `cancel_after` content chunks, or
    return (leaving it open) at the first content chunk when `until_content`."""
    result = ChatStream(response.status, response.headers.get("Content-Type", ""))
    if response.status != 200 or not result.content_type.startswith("text/event-stream"):
        result.error = (await response.json()).get("error")
        response.release()
        return result
    pieces = 0
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            result.done = True
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            result.error = chunk["error"]
            continue
        result.chunks.append(chunk)
        for choice in chunk.get("choices", []):
            content = choice["delta"].get("content")
            if content:
                result.text += content
                pieces += 1
            result.finish = choice.get("finish_reason") or result.finish
        if until_content and pieces:
            return result
        if cancel_after is not None and pieces >= cancel_after:
            result.cancelled = True
            response.close()
            return result
    response.release()
    return result


async def chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               cancel_after: int | None = None) -> ChatStream:
    """One whole streamed request (the headers of a queued one wait for its admission)."""
    return await read_chat(await open_chat(session, url, body), cancel_after)


async def continue_chat(response: aiohttp.ClientResponse, started: ChatStream) -> ChatStream:
    """Read the rest of a stream that `read_chat(until_content=True)` left open."""
    rest = await read_chat(response)
    rest.text = started.text + rest.text
    rest.chunks = started.chunks + rest.chunks
    return rest


async def watch_health(url: str, seen: list[str]) -> None:
    """Poll /health until the server stops answering; record each answer ("down" last)."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(20_000):  # bounded: the test's own timeout ends it far earlier
            try:
                async with session.get(url + "/health") as response:
                    seen.append(str(response.status))
            except (aiohttp.ClientError, asyncio.TimeoutError):
                seen.append("down")
                return
            await asyncio.sleep(0.01)


def stream_through_failure(url: str, body: dict[str, Any],
                           exit_bound_s: float) -> tuple[ChatStream, list[str], float]:
    """A stream that an engine failure ends: (the stream, /health's answers from its first
    content until the server stopped answering, when the stream ended on the monotonic clock)."""
    async def scenario():
        health: list[str] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            running = await open_chat(session, url, body)
            started = await read_chat(running, until_content=True)
            watcher = asyncio.create_task(watch_health(url, health))
            stream = await continue_chat(running, started)
            failed_at = time.monotonic()
        await asyncio.wait_for(watcher, timeout=exit_bound_s)
        return stream, health, failed_at

    return asyncio.run(asyncio.wait_for(scenario(), 180))
