"""A client that goes away cancels its engine request and is logged as 499 (§2 "SSE")."""
from __future__ import annotations

import json
import logging
import socket
import time

from fake_engine import Script


def open_chat(live, stream: bool, n: int = 1) -> socket.socket:
    body = json.dumps({"model": "fake-model", "stream": stream, "n": n,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=5)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    return sock


def read_until(sock: socket.socket, marker: bytes, limit: int = 64) -> bytes:
    received = b""
    for _ in range(limit):
        received += sock.recv(4096)
        if marker in received:
            return received
    raise AssertionError(f"{marker!r} not received: {received!r}")


def test_stream_disconnect_cancels_the_engine_request(live, caplog):
    live.engine.script = Script(pieces=("first",), hang=True)
    with caplog.at_level(logging.INFO, logger="ninfer"):
        sock = open_chat(live, stream=True)
        read_until(sock, b'"content": "first"')
        sock.close()
        assert live.engine.cancel_seen.wait(timeout=5)
    assert live.engine.cancelled == [live.engine.submitted[0].request_id]
    [line] = [r.getMessage() for r in caplog.records if "cancelled during" in r.getMessage()]
    assert line.endswith("cancelled during decode | HTTP 499 | client disconnected")


def test_stream_of_n_choices_disconnect_cancels_every_choice(live, caplog):
    live.engine.script = Script(pieces=("first",), hang=True)
    with caplog.at_level(logging.INFO, logger="ninfer"):
        sock = open_chat(live, stream=True, n=2)
        read_until(sock, b'"index": 1, "delta": {"content": "first"}')
        sock.close()
        deadline = time.monotonic() + 5
        while len(live.engine.cancelled) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sorted(live.engine.cancelled) == sorted(r.request_id for r in live.engine.submitted)
    lines = [r.getMessage() for r in caplog.records if "cancelled during" in r.getMessage()]
    assert len(lines) == 2
    assert all(line.endswith("| HTTP 499 | client disconnected") for line in lines)


def test_non_stream_disconnect_cancels_the_engine_request(live, caplog):
    live.engine.script = Script(pieces=(), hang=True)
    with caplog.at_level(logging.INFO, logger="ninfer"):
        sock = open_chat(live, stream=False)
        for _ in range(200):
            if live.engine.submitted:
                break
            live.engine.cancel_seen.wait(timeout=0.01)
        sock.close()
        assert live.engine.cancel_seen.wait(timeout=5)
    assert any("HTTP 499 | client disconnected" in r.getMessage() for r in caplog.records)


def test_finished_requests_are_not_reported_as_cancelled(live):
    assert live.chat(stream=True).status == 200
    assert live.chat().status == 200
    assert live.engine.cancelled == []
