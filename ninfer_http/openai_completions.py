"""OpenAI legacy Completions: `POST /v1/completions`, JSON or SSE (vLLM `bench serve`,
lm-eval-harness' generation tasks).

`completions_request` prepares the engine request; the text comes back as the engine wrote it
(no reasoning or tool-call splitting: the prompt had no chat template). The stream is
`data: {"object": "text_completion", "choices": [{"text", "index", "logprobs",
"finish_reason"}]}` chunks, a finish chunk, a usage chunk when `stream_options.include_usage`,
then `data: [DONE]`; a failure after the headers is one `data: {"error": ...}` and no `[DONE]`.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiohttp import web

from ninfer_engine.client import ServingEngine
from ninfer_engine.types import TokenEvent, Usage

from . import sse
from .admission import SLOTS
from .completions_request import PROTOCOL, CompletionRequest, parse_completion
from .context import client_label, ready_engine, request_id
from .errors import ApiError
from .generation import Generation, start_generation
from .ids import hex_id
from .logprobs import LogprobReader, joined
from .logs import RequestTrace
from .prompt import choice
from .streaming import serve_stream


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", create_completion)


async def create_completion(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    label = client_label(request)
    parsed = parse_completion(await request.read(), engine, request_id(request))
    created, cid = int(time.time()), hex_id("cmpl-", 32)
    async with contextlib.AsyncExitStack() as stack:
        replies = []
        for index in range(parsed.n):
            prepared = parsed.prepared if parsed.n == 1 else choice(engine, parsed.prepared, index)
            trace = RequestTrace(PROTOCOL, parsed.stream, 1, prepared.max_tokens, "off", label)
            generation = await stack.enter_async_context(
                start_generation(engine, prepared, trace, request.app[SLOTS]))
            replies.append(_Choice(generation, engine, parsed, index, cid, created))
        if parsed.stream:
            return await serve_stream(request, replies[0].generation, replies[0])
        results = await asyncio.gather(*(r.complete() for r in replies))
    usages = [usage for _, usage in results]
    usage = Usage(usages[0].prompt_tokens, sum(u.completion_tokens for u in usages))
    return web.json_response({**replies[0].envelope([c for c, _ in results]),
                              "usage": _usage(usage)})


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


class _Choice:
    """One choice: collected to a JSON choice, or streamed as chunks (`StreamProtocol`)."""

    def __init__(self, generation: Generation, engine: ServingEngine, parsed: CompletionRequest,
                 index: int, cid: str, created: int) -> None:
        self.generation = generation
        self.parsed = parsed
        self.index = index
        self.id, self.created, self.model = cid, created, engine.model_id
        self.logprobs = LogprobReader(generation.prepared.generation.logprob_sink,
                                      engine.tokenizer)
        self.offset = len(parsed.prompt_text) if parsed.echo else 0  # of the next text
        scored = generation.prepared.generation.prompt_logprob_sink is not None
        self.lead_due = scored  # the prompt's entries go with the first chunk after prefill

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices}

    def _choice(self, text: str, finish: str | None) -> dict[str, Any]:
        entries = self.logprobs.take(self.generation.output_tokens)
        logprobs = self.logprobs.completion(entries, self.offset)
        self.offset += len(text)
        return {"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": finish}

    def _lead(self, choice: dict[str, Any]) -> dict[str, Any]:
        """`choice` led by the prompt: its text (`echo`), its tokens' entries and vLLM's
        `prompt_logprobs` (the engine filled them before the first output event)."""
        self.lead_due = False
        generation, parsed = self.generation.prepared.generation, self.parsed
        sink = generation.prompt_logprob_sink or []
        led = {**choice, "text": (parsed.prompt_text if parsed.echo else "") + choice["text"]}
        if parsed.echo_logprobs:
            led["logprobs"] = joined(self.logprobs.prompt_completion(sink, generation.logprobs),
                                     choice["logprobs"])
        if parsed.prompt_logprobs is not None:
            led["prompt_logprobs"] = self.logprobs.vllm_prompt(sink, parsed.prompt_logprobs)
        return led

    async def complete(self) -> tuple[dict[str, Any], Usage]:
        deltas, event = await self.generation.collect()
        text = "".join(d.text for d in deltas)
        usage, _ = self.generation.accounting(event)
        return self._lead(self._choice(text, _finish(event))), usage

    def _chunk(self, text: str, finish: str | None = None) -> bytes:
        choice = self._choice(text, finish)
        chunk = self.envelope([self._lead(choice) if self.lead_due else choice])
        if self.parsed.include_usage:
            chunk["usage"] = None
        return sse.data(chunk)

    async def open(self, response: sse.EventWriter, first: TokenEvent) -> None:
        if self.parsed.echo and not self.lead_due:
            await response.write(sse.data(self.envelope([{
                "text": self.parsed.prompt_text, "index": 0, "logprobs": None,
                "finish_reason": None}])))

    async def feed(self, response: sse.EventWriter, event: TokenEvent) -> None:
        text = "".join(d.text for d in self.generation.splitter.feed(event.text))
        if text:
            await response.write(self._chunk(text))

    async def close(self, response: sse.EventWriter) -> None:
        last = self.generation.last
        text = "".join(d.text for d in self.generation.splitter.flush())
        error = self.generation.conclude(last)
        if error is not None:
            await response.write(self.failure(error))
            return
        await response.write(self._chunk(text, _finish(last)))
        if self.parsed.include_usage:
            usage, _ = self.generation.accounting(last)
            await response.write(sse.data({**self.envelope([]), "usage": _usage(usage)}))
        await response.write(sse.DONE)

    def failure(self, error: ApiError) -> bytes:
        return sse.data(error.openai_body())


def _finish(event: TokenEvent) -> str:
    return "length" if event.finish == "length" else "stop"
