"""OpenAI Responses (core subset): create (JSON or semantic SSE), input_tokens, retrieve, delete,
input_items, cancel and compact (contract §6).

`responses_turn.parse_turn` makes a request's `ChatRequest` over the stored conversation of
`previous_response_id` plus this request's items; `prompt.prepare()` and
`generation.Generation` do the rest, and `responses_stream.OutputBuilder` turns the generation's
channels into output items and events. Errors raised while preparing name `input` where the
shared code says `messages`. After the SSE headers a failure is `response.failed`.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any, Awaitable, Callable, Iterator

from aiohttp import web

from ninfer_engine.client import ServingEngine
from ninfer_engine.types import TokenEvent

from . import sse
from .admission import SLOTS
from .context import CONFIG, client_label, ready_engine
from .errors import ApiError, unsupported
from .generation import Generation, start_generation
from .logprobs import LogprobReader
from .logs import RequestTrace
from .media import count_prompt_tokens, prepare_with_media
from .reasoning_seal import ReasoningSeal
from .responses_pages import check_query, input_items_page
from .responses_shapes import output_message
from .responses_store import ResponseStore, StoredResponse, json_size
from .responses_stream import Event, OutputBuilder
from .responses_turn import PROTOCOL, Turn, parse_turn
from .streaming import serve_stream
from .usage import responses_usage

STORE = web.AppKey("ninfer_response_store", ResponseStore)
SEAL = web.AppKey("ninfer_reasoning_seal", ReasoningSeal)  # this process's encrypted_content key
_RETRIEVE_QUERY = frozenset({"include", "include[]", "stream", "starting_after",
                             "include_obfuscation"})


def add_responses_routes(app: web.Application) -> None:
    """Register every `/v1/responses` route and the app's response store (needs CONFIG)."""
    config = app[CONFIG]
    app[STORE] = ResponseStore(config.response_store_max_records, config.response_store_max_mib)
    app[SEAL] = ReasoningSeal()
    router = app.router
    router.add_post("/v1/responses", create_response)
    router.add_post("/v1/responses/input_tokens", count_input_tokens)
    router.add_post("/v1/responses/compact", compact)
    router.add_get("/v1/responses/{response_id}", retrieve)
    router.add_delete("/v1/responses/{response_id}", delete)
    router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    router.add_post("/v1/responses/{response_id}/cancel", cancel)
    router.add_post("/v1/responses/{response_id}/compact", compact)


@contextlib.contextmanager
def _input_param() -> Iterator[None]:
    """Shared preparation names the conversation `messages`; on this path it is `input`."""
    try:
        yield
    except ApiError as exc:
        if exc.param == "messages":
            exc.param = "input"
        raise


async def create_response(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    label = client_label(request)
    store = request.app[STORE]
    turn = parse_turn(await request.read(), engine, request.app[CONFIG], store,
                      request.app[SEAL], model_required=True)
    with _input_param():
        prepared = await prepare_with_media(request, engine, turn.chat)
    if turn.parsed.store:
        store.check_fits(json_size(turn.input_items, turn.conversation.messages))
    trace = RequestTrace(PROTOCOL, turn.chat.stream, len(turn.chat.messages),
                         prepared.max_tokens, turn.chat.thinking, label)
    async with start_generation(engine, prepared, trace, request.app[SLOTS]) as generation:
        seal = request.app[SEAL].seal if turn.parsed.encrypted_reasoning else None
        reply = _Reply(turn, generation, engine, store, seal)
        if turn.chat.stream:
            return await reply.stream(request)
        return await reply.complete()


class _Reply:
    """Turns one generation's events into a Response object or its semantic event stream."""

    def __init__(self, turn: Turn, generation: Generation, engine: ServingEngine,
                 store: ResponseStore, seal: Callable[[str], str] | None) -> None:
        self.turn = turn
        self.generation = generation
        self.engine = engine
        self.store = store
        self.created_at = int(time.time())
        self.builder = OutputBuilder(turn.parsed.tools.targets, seal, self._logprobs()
                                     if generation.prepared.generation.logprobs is not None
                                     else None)
        self._numbers = itertools.count()  # the stream's sequence_number

    def _logprobs(self) -> Callable[[], list[dict[str, Any]]]:
        """The entries of the answer tokens that arrived since the last call (the reasoning's
        tokens are left out: `output_text.logprobs` covers the message only)."""
        reader = LogprobReader(self.generation.prepared.generation.logprob_sink,
                               self.engine.tokenizer)
        return lambda: reader.entries(reader.take_answer(self.generation.answer_start,
                                                         self.generation.output_tokens))

    def _object(self, status: str, usage: dict[str, Any] | None,
                error: dict[str, Any] | None = None) -> dict[str, Any]:
        sampling = self.generation.prepared.generation.sampling
        return {
            "id": self.turn.id, "object": "response", "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "output": list(self.builder.output), "usage": usage, "model": self.engine.model_id,
            **self.turn.parsed.echo,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "store": self.turn.parsed.store,
        }

    def _finished(self, last: TokenEvent, status: str) -> dict[str, Any]:
        """The final object of a successful generation, stored when `store` is on."""
        usage, _ = self.generation.accounting(last)
        response = self._object(status, responses_usage(usage, self.generation.reasoning_tokens))
        if self.turn.parsed.store:
            conversation = (*self.turn.conversation.messages, output_message(response["output"]))
            self.store.put(StoredResponse(response, self.turn.input_items, conversation,
                                          self.turn.session_key, self.turn.preserve_thinking))
        return response

    async def complete(self) -> web.Response:
        deltas, event = await self.generation.collect()
        self.builder.feed(deltas)
        status = "incomplete" if event.finish == "length" else "completed"
        self.builder.close(status)
        return web.json_response(self._finished(event, status))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        return await serve_stream(request, self.generation, self)

    def _event(self, payload: Event) -> bytes:
        """One semantic event, numbered in stream order."""
        body = {**payload, "sequence_number": next(self._numbers)}
        return sse.event(payload["type"], body)

    def _writer(self, response: sse.EventWriter) -> Callable[[Event], Awaitable[None]]:
        async def write(payload: Event) -> None:
            await response.write(self._event(payload))
        return write

    async def open(self, response: sse.EventWriter, first: TokenEvent) -> None:
        write = self._writer(response)
        started = self._object("in_progress", None)
        await write({"type": "response.created", "response": started})
        await write({"type": "response.in_progress", "response": started})

    async def feed(self, response: sse.EventWriter, event: TokenEvent) -> None:
        deltas = self.generation.splitter.feed(event.text)
        await _write_all(self._writer(response), self.builder.feed(deltas))

    async def close(self, response: sse.EventWriter) -> None:
        write = self._writer(response)
        final = self.generation.flush(self.generation.last)
        await _write_all(write, self.builder.feed(final))
        await self._write_end(write, self.generation.last)

    def failure(self, error: ApiError) -> bytes:
        return self._event(self._failed(error))

    def _failed(self, error: ApiError) -> Event:
        failed = self._object("failed", None, {"code": error.code, "message": error.message})
        return {"type": "response.failed", "response": failed}

    async def _write_end(self, write: Callable[[Event], Awaitable[None]], last: TokenEvent
                         ) -> None:
        error = self.generation.conclude(last)
        status = "incomplete" if error is not None or last.finish == "length" else "completed"
        await _write_all(write, self.builder.close(status))
        if error is None:
            try:
                final = self._finished(last, status)
            except ApiError as exc:  # the finished Response does not fit the store
                error = exc
        if error is not None:
            await write(self._failed(error))
            return
        await write({"type": f"response.{status}", "response": final})


async def _write_all(write: Callable[[Event], Awaitable[None]], events: list[Event]) -> None:
    for event in events:
        await write(event)


async def count_input_tokens(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    turn = parse_turn(await request.read(), engine, request.app[CONFIG], request.app[STORE],
                      request.app[SEAL], model_required=False)
    with _input_param():
        count = await count_prompt_tokens(request, engine, turn.chat)
    return web.json_response({"object": "response.input_tokens", "input_tokens": count})


async def retrieve(request: web.Request) -> web.Response:
    query = check_query(request, _RETRIEVE_QUERY)
    if any(query.getall("include", []) + query.getall("include[]", [])):
        raise unsupported("include", "'include' must be empty.")
    if "starting_after" in query:
        raise unsupported("starting_after", "Stored responses cannot be streamed again.")
    if query.get("stream", "false").lower() not in ("false", "0"):
        raise unsupported("stream", "Stored responses cannot be streamed again.")
    record = request.app[STORE].get(request.match_info["response_id"])
    return web.json_response(record.response)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    request.app[STORE].delete(response_id)
    return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: web.Request) -> web.Response:
    store = request.app[STORE]
    return web.json_response(input_items_page(
        request, lambda: store.get(request.match_info["response_id"]).input_items))


async def cancel(request: web.Request) -> web.Response:
    raise ApiError(400, "Background responses are not supported, so there is nothing to cancel.",
                   "background_not_supported")


async def compact(request: web.Request) -> web.Response:
    raise ApiError(400, "Response compaction is not supported.", "compaction_not_supported")
