"""One error type for every protocol, rendered in the OpenAI or the Anthropic shape (contract §3).

Handlers and helpers raise `ApiError`; the app's error middleware renders it for the path's
dialect. Engine failures (`EngineError`) convert through `from_engine_error`.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ninfer_engine.types import EngineError

OPENAI = "openai"
ANTHROPIC = "anthropic"

# Anthropic's status and error type differ from OpenAI's for these codes (contract §3 table).
_ANTHROPIC_BY_CODE = {
    "server_overloaded": (529, "overloaded_error"),
    "request_queue_timeout": (504, "timeout_error"),
    "media_fetch_timeout": (504, "timeout_error"),
    "request_too_large": (413, "request_too_large"),
    "invalid_api_key": (401, "authentication_error"),
}
_ANTHROPIC_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class ApiError(Exception):
    """A request failure with everything both error shapes need.

    `extra` holds additional fields of the OpenAI error object (e.g. `prompt_tokens` and
    `max_context` for `context_length_exceeded`).
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        *,
        param: str | None = None,
        type: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or openai_type(status)
        self.extra = extra or {}
        self.headers = headers or {}

    def openai_body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        error.update(self.extra)
        return {"error": error}

    def anthropic_status(self) -> int:
        return _ANTHROPIC_BY_CODE.get(self.code or "", (self.status, ""))[0]

    def anthropic_body(self, request_id: str) -> dict[str, Any]:
        status = self.anthropic_status()
        fallback = "api_error" if status >= 500 else "invalid_request_error"
        kind = _ANTHROPIC_BY_CODE.get(self.code or "", (0, ""))[1]
        kind = kind or _ANTHROPIC_BY_STATUS.get(status, fallback)
        return {
            "type": "error",
            "error": {"type": kind, "message": self.message},
            "request_id": request_id,
        }

    def response(self, dialect: str, request_id: str) -> web.Response:
        """The complete HTTP error response for `dialect`."""
        if dialect == ANTHROPIC:
            status, body = self.anthropic_status(), self.anthropic_body(request_id)
        else:
            status, body = self.status, self.openai_body()
        return web.Response(
            status=status,
            text=json.dumps(body),
            content_type="application/json",
            headers=self.headers,
        )


def openai_type(status: int) -> str:
    """OpenAI's `error.type` for a status: client errors are `invalid_request_error`."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def invalid_value(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param=param)


def unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, message, "unsupported_parameter", param=param)


def missing(param: str) -> ApiError:
    message = f"Missing required parameter: '{param}'."
    return ApiError(400, message, "missing_required_parameter", param=param)


def service_unavailable(state: str) -> ApiError:
    return ApiError(503, f"The engine is not ready (state: {state}).", "service_unavailable")


def internal_error() -> ApiError:
    return ApiError(500, "Internal error while serving this request.", "internal_error")


def from_engine_error(error: EngineError | None) -> ApiError:
    """Translate an engine-side failure, keeping its status and code."""
    if error is None:
        return internal_error()
    return ApiError(error.status, error.message, error.code)
