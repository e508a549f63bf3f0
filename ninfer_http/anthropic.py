"""Anthropic Messages: `POST /v1/messages` (JSON or SSE) and `/v1/messages/count_tokens` (§7).

Errors use the Anthropic shape (the app picks it for every `/v1/messages` path). After
`message_start` a failure is an in-band `event: error`. Thinking and tool-use output blocks
arrive with the reasoning/tool-call splitter; until then all output is one text block.
"""
from __future__ import annotations

import contextlib
from typing import Any

from aiohttp import web

from ninfer_engine.types import TokenEvent, Usage

from . import sse
from .anthropic_messages import parse_messages_request
from .context import CONFIG, KEEPALIVE_S, client_label, ready_engine, request_id
from .errors import ApiError
from .generation import Generation, OutputDelta, start_generation
from .ids import anthropic_message_id
from .logs import RequestTrace
from .prompt import prepare, render_prompt
from .usage import anthropic_usage

PROTOCOL = "anthropic"
_BLOCK_TYPES = {"content": ("text", "text_delta", "text")}  # channel -> block, delta, field


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)


async def count_tokens(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    chat, _ = parse_messages_request(await request.read(), engine, request.app[CONFIG])
    return web.json_response({"input_tokens": len(render_prompt(engine, chat))})


async def create_message(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    label = client_label(request)
    chat, model = parse_messages_request(await request.read(), engine, request.app[CONFIG])
    prepared = prepare(engine, chat, request_id(request))
    trace = RequestTrace(PROTOCOL, chat.stream, len(chat.messages), prepared.max_tokens,
                         chat.thinking, label)
    wanted = engine.default_max_tokens if chat.max_tokens is None else chat.max_tokens
    async with start_generation(engine, prepared, trace) as generation:
        reply = _Reply(generation, model, wanted, request_id(request))
        if chat.stream:
            return await reply.stream(request)
        return await reply.complete()


class _Reply:
    """Turns one generation's events into a Message object or its event stream."""

    def __init__(
        self, generation: Generation, model: str, wanted_tokens: int, request_id: str
    ) -> None:
        self.id = anthropic_message_id()
        self.request_id = request_id
        self.model = model
        self.generation = generation
        self.wanted_tokens = wanted_tokens
        self.block_index = -1
        self.open_channel: str | None = None

    def _stop(self, last: TokenEvent, usage: Usage) -> tuple[str, str | None]:
        if last.finish == "length":
            # Fewer tokens than asked for: the context or the KV lease ran out, not max_tokens.
            if usage.completion_tokens < self.wanted_tokens:
                return "model_context_window_exceeded", None
            return "max_tokens", None
        if last.stop_sequence:
            return "stop_sequence", last.stop_sequence
        return "end_turn", None

    def _message(self, content: list[dict[str, Any]], usage: dict[str, Any],
                 stop: tuple[str | None, str | None]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": usage}

    async def complete(self) -> web.Response:
        generation = self.generation
        event = await generation.admit()
        deltas = generation.splitter.feed(event.text)
        while event.finish is None:
            event = await generation.next()
            assert event is not None  # no timeout was given
            deltas += generation.splitter.feed(event.text)
        deltas += generation.splitter.flush()
        error = generation.conclude(event)
        if error is not None:
            raise error
        usage, _ = generation.accounting(event)
        text = "".join(d.text for d in deltas if d.channel == "content")
        content = [{"type": "text", "text": text}] if text else []
        return web.json_response(
            self._message(content, anthropic_usage(usage), self._stop(event, usage)))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        generation = self.generation
        event: TokenEvent | None = await generation.admit()
        response = await sse.open_stream(request)
        keepalive_s = request.app[KEEPALIVE_S]
        try:
            await response.write(self._message_start(event))
            while True:
                if event is None:
                    await response.write(sse.KEEPALIVE)
                else:
                    await self._write_deltas(response, generation.splitter.feed(event.text))
                    if event.finish is not None:
                        break
                event = await generation.next(keepalive_s)
            await self._write_deltas(response, generation.splitter.flush())
            await self._write_end(response, event)
        except ConnectionResetError:
            generation.disconnected()
        except Exception:
            error = generation.broken()
            with contextlib.suppress(ConnectionResetError):
                await response.write(self._error_event(error))
        return response

    def _message_start(self, first: TokenEvent) -> bytes:
        # The engine's admission event may carry the cached/uncached split; else none is cached.
        prompt = self.generation.prepared.prompt_tokens
        start = first.usage or Usage(prompt, 0)
        usage = anthropic_usage(Usage(start.prompt_tokens, 0, start.cached_tokens))
        message = self._message([], usage, (None, None))
        return sse.event("message_start", {"type": "message_start", "message": message})

    async def _write_deltas(self, response: web.StreamResponse, deltas: list[OutputDelta]) -> None:
        for delta in deltas:
            block, delta_type, field = _BLOCK_TYPES[delta.channel]
            if delta.channel != self.open_channel:
                await self._close_block(response)
                self.block_index += 1
                self.open_channel = delta.channel
                await response.write(sse.event("content_block_start", {
                    "type": "content_block_start", "index": self.block_index,
                    "content_block": {"type": block, field: ""}}))
            await response.write(sse.event("content_block_delta", {
                "type": "content_block_delta", "index": self.block_index,
                "delta": {"type": delta_type, field: delta.text}}))

    async def _close_block(self, response: web.StreamResponse) -> None:
        if self.open_channel is not None:
            await response.write(sse.event("content_block_stop", {
                "type": "content_block_stop", "index": self.block_index}))
            self.open_channel = None

    def _error_event(self, error: ApiError) -> bytes:
        body = error.anthropic_body(self.request_id)
        return sse.event("error", {"type": "error", "error": body["error"]})

    async def _write_end(self, response: web.StreamResponse, last: TokenEvent) -> None:
        await self._close_block(response)
        error = self.generation.conclude(last)
        if error is not None:
            await response.write(self._error_event(error))
            return
        usage, _ = self.generation.accounting(last)
        stop_reason, stop_sequence = self._stop(last, usage)
        await response.write(sse.event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": anthropic_usage(usage)}))
        await response.write(sse.event("message_stop", {"type": "message_stop"}))
