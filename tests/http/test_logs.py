"""stderr log format and lines (§9), and the server helper's bind errors."""
from __future__ import annotations

import asyncio
import io
import logging
import re
import socket
import time

import pytest

from fake_engine import FAKE_CONFIG, FakeEngine
from ninfer_engine.stats import EngineStats, KvStats, QueueStats, RequestView, Throughput
from ninfer_engine.types import Timings, Usage
from ninfer_http.app import create_app
from ninfer_http.logs import (
    NinferFormatter,
    RequestTrace,
    configure_logging,
    duration,
    listening_line,
    throughput_line,
)
from ninfer_http.server import start_server

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}  [A-Z]+  ")


@pytest.fixture
def stderr():
    """Logging configured into a buffer; the `ninfer` and `aiohttp` loggers restored after."""
    loggers = [logging.getLogger(name) for name in ("ninfer", "aiohttp")]
    saved = [(logger.level, logger.propagate) for logger in loggers]
    buffer = io.StringIO()
    configure_logging("info", buffer)
    yield buffer
    for logger, (level, propagate) in zip(loggers, saved):
        for handler in [h for h in logger.handlers if isinstance(h.formatter, NinferFormatter)]:
            logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def test_format_and_levels(stderr):
    log = logging.getLogger("ninfer.test")
    log.info("hello | world")
    log.warning("careful")
    log.debug("hidden at info")
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2
    assert all(LINE.match(line) for line in lines)
    assert lines[0].endswith("  INFO  hello | world")
    assert lines[1].endswith("  WARN  careful")


def test_trace_and_off_levels(stderr):
    buffer = io.StringIO()
    configure_logging("trace", buffer)
    logging.getLogger("ninfer.x").log(5, "very detailed")
    configure_logging("off", buffer)
    logging.getLogger("ninfer.x").critical("silenced")
    [line] = buffer.getvalue().splitlines()
    assert LINE.match(line) and line.endswith("  TRACE  very detailed")
    assert stderr.getvalue() == ""  # reconfiguring replaced the earlier handler
    with pytest.raises(ValueError):
        configure_logging("loud")


def test_request_lines(stderr):
    trace = RequestTrace("openai-chat", True, 3, 8192, "medium")
    trace.done("stop", None, Usage(2139, 54088, 129),
               Timings(decode_s=2.0, predicted_n=339, draft_n=10, draft_accepted=7),
               trace.started_at + 0.323)
    started, done = [line.split("  ", 2)[2] for line in stderr.getvalue().splitlines()]
    n = trace.number
    assert started == (f"req#{n} started | openai-chat stream | 3 messages | "
                       "max output 8,192 | thinking medium")
    assert done.startswith(f"req#{n} done | openai-chat | stop token | prompt 2,139 | "
                           "output 54,088 | cache 129 (6.0%) | TTFT 323 ms | total ")
    assert done.endswith("| decode 169.0 tok/s | draft accepted 7/10 (70%)")
    assert trace.closed
    other = RequestTrace("openai-chat", False, 1, 5, "default")
    assert other.number == n + 1
    other.ended("rejected", "queue", 429, "server_overloaded")
    assert stderr.getvalue().splitlines()[-1].endswith(
        f"req#{n + 1} rejected during queue | HTTP 429 | server overloaded")


def test_server_logs_no_prompt_output_or_key(serve, stderr):
    live = serve(api_key="sekrit-key")
    live.engine.script.pieces = ("SECRET-OUTPUT",)
    reply = live.request("POST", "/v1/chat/completions",
                         {"model": "fake-model",
                          "messages": [{"role": "user", "content": "SECRET-PROMPT"}]},
                         headers={"Authorization": "Bearer sekrit-key",
                                  "X-Ninfer-Client": "tester"})
    assert reply.status == 200
    text = stderr.getvalue()
    assert "listening on http://127.0.0.1:" in text and "| auth bearer" in text
    assert (" started | openai-chat | 1 messages | max output 64 | thinking default | "
            "client tester") in text
    assert " done | openai-chat | stop token | prompt " in text
    for secret in ("SECRET-PROMPT", "SECRET-OUTPUT", "sekrit-key"):
        assert secret not in text


def test_durations_and_listening_line():
    assert duration(0.3234) == "323 ms"
    assert duration(21.04) == "21.0s"
    assert duration(321.0) == "5m 21.0s"
    assert duration(3723.0) == "1h 02m 03.0s"
    assert listening_line("127.0.0.1", 8080, "capy-flash", False) == (
        "listening on http://127.0.0.1:8080 | model capy-flash | auth disabled")


def test_throughput_line():
    assert throughput_line(EngineStats(at=0.0, state="ready")) is None
    stats = EngineStats(
        at=0.0, state="ready",
        throughput=Throughput(decode_tok_s=190.6, batch=1.0, interval_s=5.0, decode_tokens=953),
        queue=QueueStats(running=(RequestView(id="r1", phase="decode"),)),
        kv=KvStats(total=100, used=12, lent=3),
    )
    assert throughput_line(stats) == ("throughput | 5.0s | decode 190.6 tok/s (953 tok) | "
                                      "running 1 (decode-ready 1) | batch 1.00 | "
                                      "kv 12/100 pages (lent 3)")


def test_throughput_is_logged_every_interval_while_busy(serve, caplog):
    engine = FakeEngine()
    busy = EngineStats(at=0.0, state="ready",
                       throughput=Throughput(decode_tok_s=10.0, interval_s=0.05, decode_tokens=1))
    engine.snapshot = lambda: busy
    with caplog.at_level(logging.INFO, logger="ninfer"):
        serve(engine, log_stats_interval_ms=50)
        for _ in range(100):
            if any(r.getMessage().startswith("throughput | ") for r in caplog.records):
                break
            time.sleep(0.02)
    assert any(r.getMessage().startswith("throughput | 0.1s | decode 10.0 tok/s (1 tok)")
               for r in caplog.records)


def test_bind_failure_names_the_address():
    async def scenario() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
                await start_server(create_app(FakeEngine(), FAKE_CONFIG), "127.0.0.1", port)

    asyncio.run(scenario())
