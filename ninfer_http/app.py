"""The aiohttp application: routes, transport middlewares, `/health` and `/v1/models`.

Middlewares, outermost first: errors (request id, dialect, error shapes), the live media
budget's release, OPTIONS/CORS preflight, auth, body size. Response headers (request id, CORS)
are added in `on_response_prepare`, so streams and errors get them too.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

from ninfer_engine.client import ServingEngine
from ninfer_engine.config import EngineConfig
from ninfer_engine.types import EngineState

from . import (anthropic, engine_state, media, metrics, observers, openai_chat, openai_completions,
               openapi, prompt_encoder)
from .admission import SLOTS, LifetimeSlots
from .auth import has_valid_key, is_exempt
from .context import CONFIG, CREATED, DIALECT, ENGINE, KEEPALIVE_S, REQUEST_ID
from .errors import ANTHROPIC, OPENAI, ApiError, internal_error
from .ids import anthropic_request_id, openai_request_id
from .logs import log_throughput
from .media_budget import BUDGET, MediaBudget, release_middleware
from .responses import add_responses_routes

log = logging.getLogger("ninfer.http")

MIB = 1024 * 1024

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "x-request-id, request-id",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-API-Key, X-Ninfer-Client, "
    "anthropic-version, anthropic-beta, anthropic-user-profile-id",
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
}
# Linux TCP keepalive plus user timeout: a dead peer is noticed within about 20 s (§2 "SSE").
_KEEPALIVE_OPTIONS = (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3),
                      ("TCP_USER_TIMEOUT", 15000))

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(engine: ServingEngine, config: EngineConfig) -> web.Application:
    """The complete HTTP application serving `engine` under `config`."""
    app = web.Application(
        client_max_size=config.max_request_mib * MIB,
        middlewares=[error_middleware, release_middleware, preflight_middleware,
                     auth_middleware, size_middleware],
    )
    app[ENGINE] = engine
    app[CONFIG] = config
    app[KEEPALIVE_S] = 5.0
    app[CREATED] = int(time.time())
    app[SLOTS] = LifetimeSlots.for_config(config)
    media.install(app, config.media_allow_private, config.media_preprocess_threads)
    prompt_encoder.install(app)
    app[BUDGET] = MediaBudget(config.media_live_mib * MIB, config.pending_timeout_ms / 1000)
    app.on_response_prepare.append(_add_headers)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    openai_chat.add_routes(app)
    openai_completions.add_routes(app)
    anthropic.add_routes(app)
    add_responses_routes(app)
    metrics.add_routes(app)
    engine_state.add_routes(app)
    openapi.add_routes(app)
    observers.install(app)  # after metrics.add_routes: feeds its registry
    if config.log_stats_interval_ms > 0:
        app.cleanup_ctx.append(_throughput_logger)
    return app


def _tune_keepalive(request: web.Request) -> None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE_OPTIONS:
        if hasattr(socket, name):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _as_api_error(exc: web.HTTPException, request: web.Request) -> ApiError:
    if isinstance(exc, web.HTTPNotFound):
        return ApiError(404, f"Unknown path: {request.path}", "not_found")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allow = ", ".join(sorted(exc.allowed_methods))
        return ApiError(405, f"Method {request.method} is not allowed on {request.path}.",
                        "method_not_allowed", headers={"Allow": allow})
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return _too_large(request)
    return ApiError(exc.status, exc.reason, None)


def _too_large(request: web.Request) -> ApiError:
    limit = request.app[CONFIG].max_request_mib
    return ApiError(413, f"The request body is larger than {limit} MiB.", "request_too_large")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Assign the request id and render every failure in the path's error shape."""
    dialect = ANTHROPIC if request.path.startswith("/v1/messages") else OPENAI
    request[DIALECT] = dialect
    request[REQUEST_ID] = anthropic_request_id() if dialect == ANTHROPIC else openai_request_id()
    _tune_keepalive(request)
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = _as_api_error(exc, request)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        error = internal_error()
    return error.response(dialect, request[REQUEST_ID])


@web.middleware
async def preflight_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every OPTIONS is a 204 with no auth (CORS headers come from `_add_headers`)."""
    if request.method == "OPTIONS":
        return web.Response(status=204)
    return await handler(request)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[CONFIG].api_key
    if key and not is_exempt(request) and not has_valid_key(request, key):
        raise ApiError(401, "Missing or invalid API key.", "invalid_api_key")
    return await handler(request)


@web.middleware
async def size_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Reject a declared oversized body before reading it; chunked bodies hit client_max_size."""
    length = request.content_length
    if length is not None and length > request.app[CONFIG].max_request_mib * MIB:
        raise _too_large(request)
    return await handler(request)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    rid = request.get(REQUEST_ID) or openai_request_id()
    name = "request-id" if request.get(DIALECT) == ANTHROPIC else "x-request-id"
    response.headers[name] = rid
    if request.app[CONFIG].cors:
        response.headers.update(CORS_HEADERS)


async def _throughput_logger(app: web.Application) -> AsyncIterator[None]:
    interval_s = app[CONFIG].log_stats_interval_ms / 1000.0
    task = asyncio.create_task(log_throughput(app[ENGINE].snapshot, interval_s))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def health(request: web.Request) -> web.Response:
    if request.app[ENGINE].state == EngineState.READY:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "unavailable"}, status=503)


def _model_object(app: web.Application) -> dict[str, Any]:
    engine = app[ENGINE]
    return {
        "id": engine.model_id,
        "object": "model",
        "created": app[CREATED],
        "owned_by": "ninfer",
        "max_model_len": engine.max_context,
    }


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_object(request.app)]})


async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    if model_id != request.app[ENGINE].model_id:
        raise ApiError(404, f"The model '{model_id}' does not exist.", "model_not_found",
                       param="model")
    return web.json_response(_model_object(request.app))
