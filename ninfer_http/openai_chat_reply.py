"""One Chat Completions generation as a `chat.completion` object or a chunk stream (§5).

Reasoning streams as `reasoning_content`; tool calls come complete from the splitter's flush and
go out in one `tool_calls` chunk. llama.cpp's `return_progress` turns the engine's prefill
progress events into `prompt_progress` chunks, and `timings_per_token` adds the running
`timings` to every reasoning and content chunk. With `logprobs` each content chunk carries the
entries of the tokens that arrived with it.
"""
from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ninfer_engine.client import ServingEngine
from ninfer_engine.types import TokenEvent, Usage

from . import sse
from .errors import ApiError
from .generation import Generation, OutputDelta, is_failure
from .ids import chat_completion_id, hex_id
from .logprobs import LogprobReader
from .openai_fields import StreamOptions
from .streaming import serve_stream
from .usage import llama_timings, openai_chat_usage

_DELTA_KEYS = {"content": "content", "reasoning": "reasoning_content"}


def _finish_reason(finish: str | None, has_calls: bool) -> str:
    if finish == "length":
        return "length"  # a cut-off answer wins over the calls made before the cut
    return "tool_calls" if has_calls else "stop"


def _tool_calls(deltas: list[OutputDelta]) -> list[dict[str, Any]]:
    """The wire form of the parsed calls (`index` is added for stream chunks)."""
    return [{"id": hex_id("call_", 16), "type": "function",
             "function": {"name": d.tool_call.name, "arguments": d.tool_call.arguments}}
            for d in deltas if d.tool_call is not None]


class ChatReply:
    """Turns one generation's events into a Chat Completion object or chunk stream."""

    def __init__(self, generation: Generation, engine: ServingEngine,
                 options: StreamOptions, index: int = 0, first: ChatReply | None = None) -> None:
        # the choices of one response share its id and creation time
        self.id = chat_completion_id() if first is None else first.id
        self.created = int(time.time()) if first is None else first.created
        self.index = index
        self.model = engine.model_id
        self.generation = generation
        self.options = options
        self.logprobs = LogprobReader(generation.prepared.generation.logprob_sink,
                                      engine.tokenizer)

    async def complete(self) -> web.Response:
        body, usage, timings = await self.choice(0)
        return web.json_response(self.body([body], usage, self.generation.reasoning_tokens,
                                           timings))

    def body(self, choices: list[dict[str, Any]], usage: Usage, reasoning_tokens: int,
             timings: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": openai_chat_usage(usage, reasoning_tokens),
            "timings": llama_timings(timings),
            **self._prompt_logprobs(),
        }

    def _prompt_logprobs(self) -> dict[str, Any]:
        """vLLM's top-level `prompt_logprobs` when asked (choice 0's: one prompt)."""
        request = self.generation.prepared.generation
        if request.prompt_logprob_sink is None:
            return {}
        return {"prompt_logprobs": self.logprobs.vllm_prompt(request.prompt_logprob_sink,
                                                             request.prompt_logprobs)}

    async def choice(self, index: int) -> tuple[dict[str, Any], Usage, Any]:
        """This generation run to its end as choice `index`, with its usage and timings."""
        generation = self.generation
        deltas, event = await generation.collect()
        content = "".join(d.text for d in deltas if d.channel == "content")
        calls = _tool_calls(deltas)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if calls and not content else content,
            "refusal": None,
        }
        reasoning = "".join(d.text for d in deltas if d.channel == "reasoning")
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        usage, timings = generation.accounting(event)
        logprobs = self.logprobs.chat(self.logprobs.take(generation.output_tokens))
        return ({"index": index, "message": message, "logprobs": logprobs,
                 "finish_reason": _finish_reason(event.finish, bool(calls))}, usage, timings)

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.model, "choices": choices}
        if self.options.include_usage:
            chunk["usage"] = None  # every chunk but the usage chunk carries an explicit null
        chunk.update(extra)
        return sse.data(chunk)

    def _delta(self, delta: dict[str, Any], finish: str | None = None,
               logprobs: dict[str, Any] | None = None, **extra: Any) -> bytes:
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish}
        return self._chunk([choice], **extra)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        return await serve_stream(request, self.generation, self)

    async def open(self, response: sse.EventWriter, first: TokenEvent) -> None:
        await response.write(self._delta({"role": "assistant", "content": ""}))

    async def feed(self, response: sse.EventWriter, event: TokenEvent) -> None:
        if event.progress is not None and self.options.return_progress:
            await response.write(self._progress(event.progress))
        await self._write_deltas(response, self.generation.splitter.feed(event.text))

    async def close(self, response: sse.EventWriter) -> None:
        if await self.close_choice(response) is None:
            usage, _ = self.generation.accounting(self.generation.last)
            await self.write_done(response, usage, self.generation.reasoning_tokens)

    async def close_choice(self, response: sse.EventWriter) -> ApiError | None:
        """This choice's last deltas, its tool calls and its finish chunk; on a failure the
        error event instead, and the error."""
        event = self.generation.last
        final = self.generation.flush(event)
        await self._write_deltas(response, final)
        calls = [] if is_failure(event) else _tool_calls(final)
        if calls:
            indexed = [{"index": i, **call} for i, call in enumerate(calls)]
            await response.write(self._delta({"tool_calls": indexed}))
        return await self._write_finish(response, event, bool(calls))

    def failure(self, error: ApiError) -> bytes:
        return sse.data(error.openai_body())

    def _progress(self, progress: tuple[int, int, int]) -> bytes:
        total, cache, processed = progress
        return self._delta({}, prompt_progress={"total": total, "cache": cache,
                                                "processed": processed,
                                                "time_ms": self.generation.since_admission_ms()})

    async def _write_deltas(self, response: sse.EventWriter, deltas: list[OutputDelta]) -> None:
        for delta in deltas:
            if delta.channel not in _DELTA_KEYS:
                continue
            extra: dict[str, Any] = {}
            if self.options.timings_per_token:
                extra["timings"] = llama_timings(self.generation.running_timings())
            if delta.channel == "content":
                # the entries of every token that arrived up to this text
                extra["logprobs"] = self.logprobs.chat(
                    self.logprobs.take(self.generation.output_tokens))
            await response.write(self._delta({_DELTA_KEYS[delta.channel]: delta.text}, **extra))

    async def _write_finish(
        self, response: sse.EventWriter, last: TokenEvent, has_calls: bool
    ) -> ApiError | None:
        error = self.generation.conclude(last)
        if error is not None:
            await response.write(sse.data(error.openai_body()))
            return error
        _, timings = self.generation.accounting(last)
        finish = _finish_reason(last.finish, has_calls)
        if self.options.include_usage:
            await response.write(self._delta({}, finish))
        else:
            await response.write(self._delta({}, finish, timings=llama_timings(timings)))
        return None

    async def write_done(self, response: sse.EventWriter, usage: Usage,
                         reasoning_tokens: int) -> None:
        """The usage chunk (when asked for; timings of this choice) and `[DONE]`."""
        if self.options.include_usage:
            _, timings = self.generation.accounting(self.generation.last)
            await response.write(self._chunk([], usage=openai_chat_usage(usage, reasoning_tokens),
                                             timings=llama_timings(timings)))
        await response.write(sse.DONE)
