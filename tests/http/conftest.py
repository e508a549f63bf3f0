"""Fixtures: the real aiohttp server on 127.0.0.1 (free port) in a background event loop."""
from __future__ import annotations

import asyncio
import http.client
import json
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import pytest

from fake_engine import FAKE_CONFIG, FakeEngine
from ninfer_http.app import create_app
from ninfer_http.context import KEEPALIVE_S
from ninfer_http.server import RunningServer, start_server


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class LiveServer:
    engine: FakeEngine
    server: RunningServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> Reply:
        """One raw request; dict/list bodies are sent as JSON, bytes as they are."""
        headers = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            headers.setdefault("Content-Type", "application/json")
        conn = self.connection()
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        finally:
            conn.close()

    def chat(self, **fields: Any) -> Reply:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]}
        body.update(fields)
        return self.request("POST", "/v1/chat/completions", body)


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., LiveServer]]:
    """`serve(engine=None, keepalive_s=None, **config_fields)` starts a server for this test."""
    loop = _LoopThread()
    servers: list[RunningServer] = []

    def start(engine: FakeEngine | None = None, keepalive_s: float | None = None,
              **config_fields: Any) -> LiveServer:
        engine = engine or FakeEngine()
        app = create_app(engine, replace(FAKE_CONFIG, **config_fields))
        if keepalive_s is not None:
            app[KEEPALIVE_S] = keepalive_s
        server = loop.run(start_server(app, "127.0.0.1", 0, shutdown_timeout=1.0))
        servers.append(server)
        return LiveServer(engine, server)

    yield start
    for server in servers:
        loop.run(server.stop())
    loop.close()


@pytest.fixture
def live(serve: Callable[..., LiveServer]) -> LiveServer:
    """A server with a default `FakeEngine` and no API key."""
    return serve()
