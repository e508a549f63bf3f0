"""Where a generation request's life fans out to `/metrics` and the JSONL request log.

`install(app)` adds the innermost middleware, which puts the current HTTP request's `_Scope`
(sinks, request id, dialect, arrival time) in a context variable, and marks the request's
`Arrival` for the engine (queue wait and TTFT count from that same instant everywhere).
`RequestTrace` (logs.py) asks `trace_observer()` for its observer when it is created and
reports its start and its one terminal line to it, so the protocol modules pass nothing
along. Generation requests refused with an `ApiError` before a trace exists (body,
preparation, engine not ready) are reported by the middleware itself as `request_rejected`
without an id; the auth and body-size middlewares run outside it, so 401 and a declared
oversized body are not reported.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable

from aiohttp import web

from ninfer_engine.arrival import Arrival, Preparing, reset_arrival, set_arrival
from ninfer_engine.stats import time_to_first_token
from ninfer_engine.types import Timings, Usage

from .context import CONFIG, DIALECT, ENGINE, REQUEST_ID, client_label
from .errors import ANTHROPIC, ApiError
from .metrics import METRICS, RequestMetrics
from .request_log import SERVER_ARGV, RequestLog, log_throughput

if TYPE_CHECKING:
    from .logs import RequestTrace

# POST paths that start a generation, and the protocol each is logged under.
GENERATION_PATHS = {
    "/v1/chat/completions": "openai-chat",
    "/v1/completions": "openai-completions",
    "/v1/responses": "openai-responses",
    "/v1/messages": "anthropic",
}


@dataclass
class Sinks:
    """What finished requests feed; `log` is open only while the server runs with a log file."""

    metrics: RequestMetrics
    log: RequestLog | None = None
    # the supervisor's ledger of refused requests (absent on a bare engine)
    rejected: Callable[[str, str | None, str | None], None] | None = None


SINKS = web.AppKey("ninfer_observer_sinks", Sinks)
PREPARING = web.AppKey("ninfer_preparing", Preparing)


@dataclass
class _Scope:
    sinks: Sinks
    request_id: str
    dialect: str
    arrived_at: float  # time.monotonic()
    client: str | None = None
    traced: bool = False

    def rejected(self, code: str | None) -> None:
        """A refusal that never reached the engine: /metrics and the supervisor's ledger."""
        self.sinks.metrics.request_rejected(code)
        if self.sinks.rejected is not None:
            self.sinks.rejected(self.request_id, code, self.client)


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("ninfer_scope",
                                                                        default=None)


def error_fields(error: ApiError, dialect: str, request_id: str) -> dict[str, object]:
    """The status, type, code and param the client received for `error`."""
    if dialect == ANTHROPIC:
        kind = error.anthropic_body(request_id)["error"]["type"]
        return {"status": error.anthropic_status(), "type": kind, "code": error.code,
                "param": error.param}
    return {"status": error.status, "type": error.type, "code": error.code, "param": error.param}


class NullObserver:
    """For traces made outside a served request (unit tests, tools)."""

    request_id: str | None = None

    def started(self, trace: RequestTrace, stream: bool, messages: int, max_output: int,
                thinking: str, client: str | None) -> None:
        pass

    def done(self, trace: RequestTrace, finish: str, stop_sequence: str | None, usage: Usage,
             timings: Timings, first_output_at: float | None) -> None:
        pass

    def ended(self, trace: RequestTrace, outcome: str, phase: str, status: int,
              code: str | None) -> None:
        pass


class TraceObserver(NullObserver):
    """Feeds one `RequestTrace`'s start and terminal event to the metrics and the request log."""

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope
        self.request_id = scope.request_id

    def started(self, trace: RequestTrace, stream: bool, messages: int, max_output: int,
                thinking: str, client: str | None) -> None:
        log = self.scope.sinks.log
        if log is not None:
            log.request_start(trace.number, self.scope.request_id, trace.protocol, stream,
                              messages, max_output, thinking, client)

    def done(self, trace: RequestTrace, finish: str, stop_sequence: str | None, usage: Usage,
             timings: Timings, first_output_at: float | None) -> None:
        arrived = self.scope.arrived_at
        ttft_s = time_to_first_token(timings, usage.completion_tokens)
        total_s = time.monotonic() - arrived
        self.scope.sinks.metrics.request_done(finish, usage, timings, ttft_s)
        log = self.scope.sinks.log
        if log is not None:
            first_output_s = None if first_output_at is None else first_output_at - arrived
            log.request_done(trace.number, self.scope.request_id, trace.protocol, finish,
                             stop_sequence is not None, usage, timings,
                             trace.started_at - arrived, ttft_s, total_s, first_output_s)

    def ended(self, trace: RequestTrace, outcome: str, phase: str, status: int,
              code: str | None) -> None:
        scope, log = self.scope, self.scope.sinks.log
        if outcome == "rejected":
            if code == "server_overloaded":  # refused at the door: the engine never saw it
                scope.rejected(code)
            else:
                scope.sinks.metrics.request_rejected(code)
            if log is not None:
                error = ApiError(status, "", code)
                log.request_rejected(trace.number, scope.request_id, trace.protocol, phase,
                                     error_fields(error, scope.dialect, scope.request_id))
        elif log is not None:
            log.request_error(trace.number, scope.request_id, trace.protocol, outcome, phase,
                              status, code)


def trace_observer() -> NullObserver:
    """The observer for a trace created while handling the current request."""
    scope = _SCOPE.get()
    if scope is None:
        return NullObserver()
    scope.traced = True
    return TraceObserver(scope)


@web.middleware
async def scope_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    scope = _Scope(request.app[SINKS], request[REQUEST_ID], request[DIALECT], time.monotonic(),
                   _label(request))
    token = _SCOPE.set(scope)
    hold = (request.app[PREPARING].hold()
            if request.method == "POST" and request.path in GENERATION_PATHS else None)
    arrival = set_arrival(Arrival(scope.arrived_at, scope.client, hold))
    try:
        return await handler(request)
    except ApiError as error:
        protocol = GENERATION_PATHS.get(request.path)
        if protocol is not None and request.method == "POST" and not scope.traced:
            _rejected_before_trace(scope, protocol, error)
        raise
    finally:
        if hold is not None:  # a request that ended before its hand-over
            hold.release()
        reset_arrival(arrival)
        _SCOPE.reset(token)


def _label(request: web.Request) -> str | None:
    try:
        return client_label(request)
    except ApiError:  # the handler refuses the request for it; the label is not shown
        return None


def _rejected_before_trace(scope: _Scope, protocol: str, error: ApiError) -> None:
    scope.rejected(error.code)
    if scope.sinks.log is not None:
        scope.sinks.log.request_rejected(None, scope.request_id, protocol, "prepare",
                                         error_fields(error, scope.dialect, scope.request_id))


async def _request_log_context(app: web.Application) -> AsyncIterator[None]:
    """Open the log at startup (an unwritable file fails startup with OSError), close at exit."""
    config, sinks, snapshot = app[CONFIG], app[SINKS], app[ENGINE].snapshot
    if config.request_log_jsonl is None:
        yield
        return
    log = RequestLog(config.request_log_jsonl)
    log.server_start(config, app.get(SERVER_ARGV), snapshot())
    sinks.log = log
    task = None
    if config.log_stats_interval_ms > 0:
        interval_s = config.log_stats_interval_ms / 1000.0
        task = asyncio.create_task(log_throughput(log, snapshot, interval_s))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        sinks.log = None
        log.close()


def install(app: web.Application) -> None:
    """Wire request observation into `app`; call after `metrics.add_routes(app)`."""
    app[SINKS] = Sinks(app[METRICS], rejected=getattr(app[ENGINE], "record_rejection", None))
    app[PREPARING] = Preparing()
    app.middlewares.append(scope_middleware)
    app.cleanup_ctx.append(_request_log_context)
