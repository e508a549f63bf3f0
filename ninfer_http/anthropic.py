"""Anthropic Messages: `POST /v1/messages` (JSON or SSE) and `/v1/messages/count_tokens` (§7).

Errors use the Anthropic shape (the app picks it for every `/v1/messages` path). After
`message_start` a failure is an in-band `event: error`. Content is a thinking block (reasoning;
signed with the message id, or with `display: "omitted"` shown empty and carried in the
signature), a text block, then one `tool_use` block per call from the splitter's flush.
"""
from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from ninfer_engine.types import TokenEvent, Usage

from . import sse
from .admission import SLOTS
from .anthropic_conversation import SIGNATURE_PREFIX
from .anthropic_messages import parse_messages_request
from .context import CONFIG, client_label, ready_engine, request_id
from .errors import ApiError
from .generation import Generation, OutputDelta, is_failure, start_generation
from .ids import anthropic_message_id, hex_id
from .logs import RequestTrace
from .media import count_prompt_tokens, prepare_with_media
from .streaming import serve_stream
from .usage import anthropic_usage

PROTOCOL = "anthropic"
# channel -> block type, delta type, text field
_BLOCK_TYPES = {"content": ("text", "text_delta", "text"),
                "reasoning": ("thinking", "thinking_delta", "thinking")}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)


async def count_tokens(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    chat, _, _ = parse_messages_request(await request.read(), engine, request.app[CONFIG],
                                        counting=True)
    return web.json_response({"input_tokens": await count_prompt_tokens(request, engine, chat)})


async def create_message(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    label = client_label(request)
    chat, model, omit_thinking = parse_messages_request(await request.read(), engine,
                                                        request.app[CONFIG])
    prepared = await prepare_with_media(request, engine, chat)
    trace = RequestTrace(PROTOCOL, chat.stream, len(chat.messages), prepared.max_tokens,
                         chat.thinking, label)
    wanted = engine.default_max_tokens if chat.max_tokens is None else chat.max_tokens
    async with start_generation(engine, prepared, trace, request.app[SLOTS]) as generation:
        reply = _Reply(generation, model, wanted, request_id(request), omit_thinking)
        if chat.stream:
            return await reply.stream(request)
        return await reply.complete()


class _Reply:
    """Turns one generation's events into a Message object or its event stream."""

    def __init__(self, generation: Generation, model: str, wanted_tokens: int, request_id: str,
                 omit_thinking: bool) -> None:
        self.id = anthropic_message_id()
        self.request_id = request_id
        self.model = model
        self.generation = generation
        self.wanted_tokens = wanted_tokens
        self.omit_thinking = omit_thinking
        self.reasoning: list[str] = []  # the thinking so far, for an omitted-display signature
        self.block_index = -1
        self.open_channel: str | None = None

    def _stop(self, last: TokenEvent, usage: Usage, has_calls: bool) -> tuple[str, str | None]:
        if last.finish == "length":
            # Fewer tokens than asked for: the context or the KV lease ran out, not max_tokens.
            if usage.completion_tokens < self.wanted_tokens:
                return "model_context_window_exceeded", None
            return "max_tokens", None
        if has_calls:
            return "tool_use", None
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
        deltas, event = await generation.collect()
        usage, _ = generation.accounting(event)
        content: list[dict[str, Any]] = []
        self.reasoning = [d.text for d in deltas if d.channel == "reasoning"]
        if self.reasoning:
            visible = "" if self.omit_thinking else "".join(self.reasoning)
            content.append({"type": "thinking", "thinking": visible,
                            "signature": self._signature()})
        text = "".join(d.text for d in deltas if d.channel == "content")
        if text:
            content.append({"type": "text", "text": text})
        calls = [_tool_use(d) for d in deltas if d.channel == "tool_call"]
        content += calls
        return web.json_response(self._message(
            content, anthropic_usage(usage, generation.reasoning_tokens),
            self._stop(event, usage, bool(calls))))

    def _signature(self) -> str:
        if not self.omit_thinking:
            return self.id
        text = "".join(self.reasoning).encode()
        return SIGNATURE_PREFIX + base64.b64encode(text).decode()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        return await serve_stream(request, self.generation, self)

    async def open(self, response: sse.EventWriter, first: TokenEvent) -> None:
        await response.write(self._message_start(first))

    async def feed(self, response: sse.EventWriter, event: TokenEvent) -> None:
        await self._write_deltas(response, self.generation.splitter.feed(event.text))

    async def close(self, response: sse.EventWriter) -> None:
        event = self.generation.last
        final = self.generation.flush(event)
        await self._write_deltas(response, final)
        calls = [] if is_failure(event) else [_tool_use(d) for d in final
                                              if d.channel == "tool_call"]
        for call in calls:
            await self._write_tool_use(response, call)
        await self._write_end(response, event, bool(calls))

    def failure(self, error: ApiError) -> bytes:
        return self._error_event(error)

    def _message_start(self, first: TokenEvent) -> bytes:
        # The engine's admission event may carry the cached/uncached split; else none is cached.
        prompt = self.generation.prepared.prompt_tokens
        start = first.usage or Usage(prompt, 0)
        usage = anthropic_usage(Usage(start.prompt_tokens, 0, start.cached_tokens))
        message = self._message([], usage, (None, None))
        return sse.event("message_start", {"type": "message_start", "message": message})

    async def _write_deltas(self, response: sse.EventWriter, deltas: list[OutputDelta]) -> None:
        for delta in deltas:
            if delta.channel not in _BLOCK_TYPES:
                continue  # tool calls are written after the flush
            block, delta_type, field = _BLOCK_TYPES[delta.channel]
            if delta.channel != self.open_channel:
                start = {"type": block, field: ""}
                if block == "thinking":
                    start["signature"] = ""
                await self._open_block(response, delta.channel, start)
            if delta.channel == "reasoning":
                self.reasoning.append(delta.text)
                if self.omit_thinking:
                    continue
            await self._write_block_delta(response, {"type": delta_type, field: delta.text})

    async def _write_tool_use(self, response: sse.EventWriter, call: dict[str, Any]) -> None:
        await self._open_block(response, "tool_call", {**call, "input": {}})
        await self._write_block_delta(response, {"type": "input_json_delta",
                                                 "partial_json": json.dumps(call["input"])})

    async def _open_block(self, response: sse.EventWriter, channel: str,
                          block: dict[str, Any]) -> None:
        await self._close_block(response)
        self.block_index += 1
        self.open_channel = channel
        await response.write(sse.event("content_block_start", {
            "type": "content_block_start", "index": self.block_index, "content_block": block}))

    async def _write_block_delta(self, response: sse.EventWriter,
                                 delta: dict[str, Any]) -> None:
        await response.write(sse.event("content_block_delta", {
            "type": "content_block_delta", "index": self.block_index, "delta": delta}))

    async def _close_block(self, response: sse.EventWriter) -> None:
        if self.open_channel == "reasoning":
            await self._write_block_delta(response, {"type": "signature_delta",
                                                     "signature": self._signature()})
        if self.open_channel is not None:
            await response.write(sse.event("content_block_stop", {
                "type": "content_block_stop", "index": self.block_index}))
            self.open_channel = None

    def _error_event(self, error: ApiError) -> bytes:
        body = error.anthropic_body(self.request_id)
        return sse.event("error", {"type": "error", "error": body["error"]})

    async def _write_end(
        self, response: sse.EventWriter, last: TokenEvent, has_calls: bool
    ) -> None:
        await self._close_block(response)
        error = self.generation.conclude(last)
        if error is not None:
            await response.write(self._error_event(error))
            return
        usage, _ = self.generation.accounting(last)
        stop_reason, stop_sequence = self._stop(last, usage, has_calls)
        await response.write(sse.event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": anthropic_usage(usage, self.generation.reasoning_tokens)}))
        await response.write(sse.event("message_stop", {"type": "message_stop"}))


def _tool_use(delta: OutputDelta) -> dict[str, Any]:
    """A parsed call as a `tool_use` content block."""
    assert delta.tool_call is not None
    return {"type": "tool_use", "id": hex_id("toolu_", 16), "name": delta.tool_call.name,
            "input": json.loads(delta.tool_call.arguments)}
