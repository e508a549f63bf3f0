"""What handlers read from the application and the request: engine, config, ids."""
from __future__ import annotations

import re

from aiohttp import web

from ninfer_engine.client import ServingEngine
from ninfer_engine.config import EngineConfig
from ninfer_engine.types import EngineState

from .errors import ApiError, service_unavailable

ENGINE = web.AppKey("ninfer_engine", ServingEngine)
CONFIG = web.AppKey("ninfer_config", EngineConfig)
KEEPALIVE_S = web.AppKey("ninfer_keepalive_s", float)  # SSE comment after this much silence
CREATED = web.AppKey("ninfer_created", int)  # the model object's `created`
REQUEST_ID = web.RequestKey("ninfer_request_id", str)
DIALECT = web.RequestKey("ninfer_dialect", str)  # errors.OPENAI or errors.ANTHROPIC
_CLIENT_LABEL = re.compile(r"[A-Za-z0-9._\-:/]{1,64}")


def request_id(request: web.Request) -> str:
    """The id sent in this response's `x-request-id` / `request-id` header."""
    return request[REQUEST_ID]


def ready_engine(request: web.Request) -> ServingEngine:
    """The engine, if it can generate; loading, reloading or failed is a 503."""
    engine = request.app[ENGINE]
    state = engine.state
    if state != EngineState.READY:
        raise service_unavailable(EngineState(state).value)
    return engine


def client_label(request: web.Request) -> str | None:
    """The optional `X-Ninfer-Client` request-log label (1..64 of `A-Z a-z 0-9 . _ - : /`)."""
    label = request.headers.get("X-Ninfer-Client")
    if label is not None and not _CLIENT_LABEL.fullmatch(label):
        raise ApiError(400, "X-Ninfer-Client must be 1 to 64 characters of A-Z a-z 0-9 . _ - : /",
                       "invalid_client_label", param="X-Ninfer-Client")
    return label
