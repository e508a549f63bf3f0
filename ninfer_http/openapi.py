"""`GET /openapi.json` (contract §12): an OpenAPI 3.1 document of every endpoint (contract §1).

Paths, parameters and status codes are here; the request and response schemas are in
`openapi_schemas`. The document names the served model (the only `model` the OpenAI paths
accept), so generated examples reach the engine. Needs the API key when one is set.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from .context import ENGINE
from .openapi_schemas import ARRAY, BOOLEAN, STRING, Schema, component_schemas, obj, ref

JSON = "application/json"
SSE = "text/event-stream"
API_VERSION = "0.1.0"  # the document's own version (info.version)

_ERROR_TEXT = {
    400: "Invalid request (`error.code` names the reason, `param` the field).",
    401: "Missing or invalid API key.",
    404: "Unknown model, response or path.",
    413: "Body larger than `--max-request-mib`.",
    429: "All lifetime slots are busy (`server_overloaded`).",
    500: "Internal error of this request.",
    502: "A media URL could not be fetched.",
    503: "Engine not ready, failed, or the queue deadline passed.",
    504: "Queue deadline passed, or a media fetch timed out.",
    529: "All lifetime slots are busy (`overloaded_error`).",
}
_OPENAI_GENERATION = (400, 401, 404, 413, 429, 500, 502, 503)
_ANTHROPIC_GENERATION = (400, 401, 413, 500, 502, 503, 504, 529)


def _errors(*statuses: int, anthropic: bool = False) -> dict[str, Any]:
    shape = ref("AnthropicError" if anthropic else "OpenAIError")
    return {str(s): {"description": _ERROR_TEXT[s], "content": {JSON: {"schema": shape}}}
            for s in statuses}


def _ok(schema: Schema, stream: bool = False, media: str = JSON) -> dict[str, Any]:
    content: dict[str, Any] = {media: {"schema": schema}}
    if stream:
        content[SSE] = {"schema": STRING}  # with `"stream": true`
    return {"200": {"description": "Success.", "content": content}}


def _op(summary: str, responses: dict[str, Any], body: str | None = None,
        parameters: tuple[dict[str, Any], ...] = (), **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses, **extra}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(body)}}}
    if parameters:
        op["parameters"] = list(parameters)
    return op


def _param(name: str, where: str, schema: Schema) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


_CLIENT = _param("X-Ninfer-Client", "header", {"type": "string",
                                              "pattern": "^[A-Za-z0-9._:/-]{1,64}$"})
_RESPONSE_ID = _param("response_id", "path", STRING)
_STORED_QUERY = (_param("include", "query", {"type": "array", "maxItems": 0}),
                 _param("stream", "query", {"const": False}),
                 _param("starting_after", "query", {"type": "integer"}))
_PAGE_QUERY = (_param("after", "query", STRING),
               _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100}),
               _param("order", "query", {"enum": ["asc", "desc"]}),
               _param("include", "query", {"type": "array",
                                           "items": {"const": "message.input_image.image_url"}}))
_ANTHROPIC_EXTRAS = (_param("beta", "query", STRING), _param("anthropic-version", "header", STRING),
                     _param("anthropic-beta", "header", STRING))


def _openai_paths() -> dict[str, Any]:
    health = obj({"status": {"enum": ["ok", "unavailable"]}}, "status")
    return {
        "/health": {"get": _op("Engine health (no auth)", {
            **_ok(health), "503": {"description": "Loading, reloading or failed.",
                                   "content": {JSON: {"schema": health}}}}, security=[])},
        "/v1/models": {"get": _op("The served model", {
            **_ok(obj({"object": {"const": "list"}, "data": {"type": "array",
                                                             "items": ref("Model")}})),
            **_errors(401)})},
        "/v1/models/{model_id}": {"get": _op("One model", {**_ok(ref("Model")),
                                                           **_errors(401, 404)},
                                             parameters=(_param("model_id", "path", STRING),))},
        "/v1/chat/completions": {"post": _op(
            "OpenAI Chat Completions (JSON or SSE)",
            {**_ok(ref("ChatCompletion"), stream=True), **_errors(*_OPENAI_GENERATION)},
            "ChatCompletionRequest", (_CLIENT,))},
        "/v1/completions": {"post": _op(
            "OpenAI legacy Completions (JSON or SSE; no chat template)",
            {**_ok(ref("Completion"), stream=True), **_errors(*_OPENAI_GENERATION)},
            "CompletionRequest", (_CLIENT,))},
    }


def _responses_paths() -> dict[str, Any]:
    never = "Always 400 `{}`"
    return {
        "/v1/responses": {"post": _op(
            "OpenAI Responses (JSON or semantic SSE)",
            {**_ok(ref("Response"), stream=True), **_errors(*_OPENAI_GENERATION)},
            "ResponseCreateRequest", (_CLIENT,))},
        "/v1/responses/input_tokens": {"post": _op(
            "Count a create body's input tokens",
            {**_ok(obj({"object": {"const": "response.input_tokens"},
                        "input_tokens": {"type": "integer"}})), **_errors(400, 401, 404, 413)},
            "ResponseInputTokensRequest")},
        "/v1/responses/compact": {"post": _op(never.format("compaction_not_supported"),
                                              _errors(400, 401))},
        "/v1/responses/{response_id}": {
            "get": _op("A stored Response", {**_ok(ref("Response")), **_errors(400, 401, 404)},
                       parameters=(_RESPONSE_ID, *_STORED_QUERY)),
            "delete": _op("Delete a stored Response", {
                **_ok(obj({"id": STRING, "object": {"const": "response.deleted"},
                           "deleted": {"const": True}})), **_errors(401, 404)},
                parameters=(_RESPONSE_ID,)),
        },
        "/v1/responses/{response_id}/input_items": {"get": _op(
            "Every item used to generate a stored Response (earlier turns' too)",
            {**_ok(obj({"object": {"const": "list"}, "data": ARRAY,
                        "first_id": {"type": ["string", "null"]},
                        "last_id": {"type": ["string", "null"]}, "has_more": BOOLEAN})),
             **_errors(400, 401, 404)},
            parameters=(_RESPONSE_ID, *_PAGE_QUERY))},
        "/v1/responses/{response_id}/cancel": {"post": _op(
            never.format("background_not_supported"), _errors(400, 401),
            parameters=(_RESPONSE_ID,))},
        "/v1/responses/{response_id}/compact": {"post": _op(
            never.format("compaction_not_supported"), _errors(400, 401),
            parameters=(_RESPONSE_ID,))},
    }


def _other_paths() -> dict[str, Any]:
    return {
        "/v1/messages": {"post": _op(
            "Anthropic Messages (JSON or SSE)",
            {**_ok(ref("Message"), stream=True),
             **_errors(*_ANTHROPIC_GENERATION, anthropic=True)},
            "MessagesRequest", (_CLIENT, *_ANTHROPIC_EXTRAS))},
        "/v1/messages/count_tokens": {"post": _op(
            "Count a Messages body's input tokens",
            {**_ok(ref("InputTokens")), **_errors(400, 401, 413, anthropic=True)},
            "MessagesRequest", _ANTHROPIC_EXTRAS)},
        "/metrics": {"get": _op("Prometheus metrics, every name prefixed `ninfer:`",
                                {**_ok(STRING, media="text/plain"), **_errors(401)})},
        "/engine/state": {"get": _op("The latest engine snapshot (no prompt or output text)",
                                     {**_ok(ref("EngineState")), **_errors(401)})},
        "/openapi.json": {"get": _op("This document",
                                     {**_ok({"type": "object"}), **_errors(401)})},
    }


def openapi_document(model_id: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this server, which serves `model_id`."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "ninfer-serve", "version": API_VERSION,
                 "description": "OpenAI- and Anthropic-compatible LLM server. Every path also "
                                "answers OPTIONS with 204 (no auth; CORS headers with --cors)."},
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": {**_openai_paths(), **_responses_paths(), **_other_paths()},
        "components": {
            "schemas": component_schemas(model_id),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
    }


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(request.app[ENGINE].model_id))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/openapi.json", openapi_json)
