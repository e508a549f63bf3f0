"""Lifetime slots and the queue deadline over HTTP (contract §3 429/529 and 503/504 rows, §4).

The scripted engine holds requests open; the C + P slots are counted by the HTTP layer alone.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path
from typing import AsyncIterator

import pytest
from fake_engine import FakeEngine, Script

from ninfer_engine.cli.capabilities import Machine, check_features
from ninfer_engine.cli.flags import parse_args
from ninfer_engine.types import EngineError, GenerationRequest, TokenEvent
from ninfer_http.admission import SLOTS

CHAT = ("/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]})
RESPONSES = ("/v1/responses", {"model": "fake-model", "input": "Hi"})
MESSAGES = ("/v1/messages",
            {"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
QUEUE_TIMEOUT = EngineError("not admitted in time", "request_queue_timeout", 503)


def send(live, path: str, body: dict) -> socket.socket:
    """Start a request on a raw socket and leave it open (it holds its slot until closed)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=5)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    received = b""
    for _ in range(64):
        received += sock.recv(4096)
        if marker in received:
            return received
    raise AssertionError(f"{marker!r} not received: {received!r}")


def wait_for(condition, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def hold(live, count: int) -> list[socket.socket]:
    """`count` requests that wait in the engine until their client goes away."""
    live.engine.script = Script(pieces=(), hang=True)
    socks = [send(live, *CHAT) for _ in range(count)]
    wait_for(lambda: len(live.engine.submitted) == count, f"{count} submitted requests")
    return socks


def release(live, socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()
    wait_for(lambda: live.server.runner.app[SLOTS].in_use == 0, "the slots to be given back")
    live.engine.script = Script()


@pytest.mark.parametrize("stream", [False, True])
def test_all_slots_taken_is_429_at_once_on_openai_paths(serve, stream, caplog):
    live = serve(max_concurrency=1, max_pending_requests=1)
    socks = hold(live, 2)
    try:
        with caplog.at_level(logging.INFO, logger="ninfer"):
            for path, body in (CHAT, RESPONSES):
                reply = live.request("POST", path, {**body, "stream": stream})
                assert reply.status == 429
                assert reply.headers["content-type"].startswith("application/json")
                error = reply.json()["error"]
                assert (error["type"], error["code"]) == ("rate_limit_error", "server_overloaded")
        assert len(live.engine.submitted) == 2  # the rejected ones never reached the engine
        lines = [r.getMessage() for r in caplog.records if "rejected during" in r.getMessage()]
        assert len(lines) == 2
        assert all(line.endswith("rejected during queue | HTTP 429 | server overloaded")
                   for line in lines)
    finally:
        release(live, socks)
    assert live.request("POST", CHAT[0], CHAT[1]).status == 200


@pytest.mark.parametrize("stream", [False, True])
def test_all_slots_taken_is_529_on_anthropic(serve, stream):
    live = serve(max_concurrency=1, max_pending_requests=1)
    socks = hold(live, 2)
    try:
        reply = live.request("POST", MESSAGES[0], {**MESSAGES[1], "stream": stream})
    finally:
        release(live, socks)
    assert reply.status == 529
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert body["request_id"] == reply.headers["request-id"]


def test_no_pending_slots_means_c_concurrent_requests(serve):
    live = serve(max_concurrency=2, max_pending_requests=0)
    socks = hold(live, 2)
    try:
        assert live.chat().status == 429
    finally:
        release(live, socks)
    assert live.chat().status == 200


def test_finished_and_failed_requests_give_their_slot_back(serve):
    live = serve(max_concurrency=1, max_pending_requests=0)
    assert live.chat().status == 200
    assert live.chat(stream=True).status == 200
    live.engine.script = Script(reject=EngineError("bad", "internal_error", 500))
    assert live.chat().status == 500
    live.engine.script = Script()
    assert live.chat().status == 200
    assert live.server.runner.app[SLOTS].in_use == 0


def test_parse_errors_take_no_slot(serve):
    live = serve(max_concurrency=1, max_pending_requests=0)
    socks = hold(live, 1)
    try:
        reply = live.request("POST", CHAT[0], b"{not json")
        assert reply.status == 400  # validation comes before admission
    finally:
        release(live, socks)


@pytest.mark.parametrize("stream", [False, True])
def test_queue_deadline_is_503_openai_and_504_anthropic_before_any_header(live, stream):
    live.engine.script = Script(reject=QUEUE_TIMEOUT)
    for path, body in (CHAT, RESPONSES):
        reply = live.request("POST", path, {**body, "stream": stream})
        assert reply.status == 503
        assert reply.headers["content-type"].startswith("application/json")
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "request_queue_timeout")
    reply = live.request("POST", MESSAGES[0], {**MESSAGES[1], "stream": stream})
    assert reply.status == 504
    assert reply.json()["error"]["type"] == "timeout_error"


class AdmitThenWait(FakeEngine):
    """Sends the admission event (empty) and then nothing until the client goes away."""

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self.submitted.append(request)
        return self._admitted()

    async def _admitted(self) -> AsyncIterator[TokenEvent]:
        yield TokenEvent()
        await asyncio.Event().wait()


@pytest.mark.parametrize("path, body, first", [
    (*CHAT, b'"role": "assistant"'),
    (*MESSAGES, b"event: message_start"),
    (*RESPONSES, b"event: response.in_progress"),
])
def test_stream_starts_at_admission_before_the_first_token(serve, path, body, first):
    live = serve(engine=AdmitThenWait())
    sock = send(live, path, {**body, "stream": True})
    try:
        head = read_until(sock, first)
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head


def test_admission_flags_are_accepted():
    parsed = parse_args([str(Path("m.ninfer")), "--max-pending-requests", "0",
                         "--pending-timeout-ms", "250"])
    check_features(parsed.config, parsed.explicit, Machine(cuda_devices=0))
    assert (parsed.config.max_pending_requests, parsed.config.pending_timeout_ms) == (0, 250)
