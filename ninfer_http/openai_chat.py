"""OpenAI Chat Completions: `POST /v1/chat/completions`, JSON or SSE (contract §5).

Parsing (`openai_fields`, `openai_messages`) ends in a protocol-neutral `ChatRequest`;
`prompt.prepare()` and `generation.Generation` do the rest, and `openai_chat_reply.ChatReply`
writes the answer. Everything up to the engine's first event fails as a plain HTTP error; after
the SSE headers a failure is one `data: {"error": ...}` event and no `[DONE]`. `n` > 1
runs one generation per choice (each its own engine request, one response id): the JSON answer
comes when all are done; a stream interleaves the choices' chunks (each with its `index`) as
their events arrive, each choice's finish chunk when it ends, then one usage chunk for all.
"""
from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from ninfer_engine.client import ServingEngine
from ninfer_engine.types import TokenEvent, Usage

from . import sse
from .admission import SLOTS
from .context import CONFIG, KEEPALIVE_S, client_label, ready_engine
from .errors import ApiError
from .generation import start_generation
from .logs import RequestTrace
from .media import prepare_with_media
from .openai_chat_reply import ChatReply
from .openai_fields import StreamOptions, parse_chat_request
from .prompt import ChatRequest, PreparedRequest, choice

PROTOCOL = "openai-chat"


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", create_chat_completion)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    label = client_label(request)
    chat, options = parse_chat_request(await request.read(), engine, request.app[CONFIG])
    prepared = await prepare_with_media(request, engine, chat)
    if options.n > 1:
        return await _serve_choices(request, engine, chat, prepared, options, label)
    trace = RequestTrace(PROTOCOL, chat.stream, len(chat.messages), prepared.max_tokens,
                         chat.thinking, label)
    async with start_generation(engine, prepared, trace, request.app[SLOTS]) as generation:
        reply = ChatReply(generation, engine, options)
        if chat.stream:
            return await reply.stream(request)
        return await reply.complete()


async def _serve_choices(request: web.Request, engine: ServingEngine, chat: ChatRequest,
                         prepared: PreparedRequest, options: StreamOptions, label: str | None
                         ) -> web.StreamResponse:
    """`n` choices of one prompt: n engine requests (each logged as one) run together, one
    response id; streamed, their chunks interleave in the order the engine's events arrive."""
    async with contextlib.AsyncExitStack() as stack:
        replies: list[ChatReply] = []
        for index in range(options.n):
            trace = RequestTrace(PROTOCOL, chat.stream, len(chat.messages), prepared.max_tokens,
                                 chat.thinking, label)
            generation = await stack.enter_async_context(start_generation(
                engine, choice(engine, prepared, index), trace, request.app[SLOTS]))
            replies.append(ChatReply(generation, engine, options, index,
                                     replies[0] if replies else None))
        if chat.stream:
            return await _stream_choices(request, replies)
        results = await asyncio.gather(*(r.choice(r.index) for r in replies))
    first = replies[0]
    usage = _total_usage([usage for _, usage, _ in results])
    reasoning = sum(r.generation.reasoning_tokens for r in replies)
    return web.json_response(first.body([c for c, _, _ in results], usage, reasoning,
                                        results[0][2]))


def _total_usage(usages: list[Usage]) -> Usage:
    """One prompt, every choice's completion tokens."""
    return Usage(usages[0].prompt_tokens, sum(u.completion_tokens for u in usages),
                 usages[0].cached_tokens)


async def _stream_choices(request: web.Request, replies: list[ChatReply]) -> web.StreamResponse:
    """`serve_stream` for several choices: each choice's chunks as its events arrive, its
    finish chunk when it ends, then (all ended) the usage chunk and `[DONE]`. A choice that
    fails ends the stream with its error event; the others are cancelled."""
    firsts = [await reply.generation.admit() for reply in replies]
    response = await sse.open_stream(request)
    waiting: dict[asyncio.Future[TokenEvent | None], ChatReply] = {}
    try:
        for reply, first in zip(replies, firsts):
            await reply.open(response, first)
        arrived = list(zip(replies, firsts))
        while True:
            for reply, event in arrived:
                await reply.feed(response, event)
                if event.finish is None:
                    waiting[asyncio.ensure_future(reply.generation.next())] = reply
                    continue
                reply.generation.last = event
                error = await reply.close_choice(response)
                if error is not None:
                    _end_others(replies, error)
                    return response
            if not waiting:
                break
            done, _ = await asyncio.wait(waiting, timeout=request.app[KEEPALIVE_S],
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                await response.write(sse.KEEPALIVE)
            arrived = sorted(((waiting.pop(task), task.result()) for task in done),
                             key=lambda pair: pair[0].index)
        await replies[0].write_done(response, _total_usage(
            [r.generation.accounting(r.generation.last)[0] for r in replies]),
            sum(r.generation.reasoning_tokens for r in replies))
    except ConnectionResetError:
        for reply in replies:
            reply.generation.disconnected()
    except Exception:
        error = replies[0].generation.broken()
        _end_others(replies, error)
        with contextlib.suppress(ConnectionResetError):
            await response.write(sse.data(error.openai_body()))
    finally:
        for task in waiting:
            task.cancel()
    return response


def _end_others(replies: list[ChatReply], error: ApiError) -> None:
    """Log the choices a failed one took down (their requests are cancelled on exit)."""
    for reply in replies:
        generation = reply.generation
        if not generation.trace.closed:
            generation.trace.ended("cancelled", generation.phase, error.status, error.code)
