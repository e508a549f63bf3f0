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
from dataclasses import replace

from ninfer_engine.stats import (Counters, EngineStats, ExpertStats, KvStats, QueueStats,
                                 RequestView, Throughput)
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
    trace = RequestTrace("openai-chat", True, 3, 8192, "medium", client="bench")
    # TTFT is the engine's, from arrival: queue wait plus prefill
    trace.done("stop", None, Usage(2139, 54088, 129),
               Timings(queue_s=0.120, prefill_s=0.203, decode_s=2.0, predicted_n=339, draft_n=10,
                       draft_accepted=7),
               trace.started_at + 0.2)
    started, done = [line.split("  ", 2)[2] for line in stderr.getvalue().splitlines()]
    n = trace.number
    assert started == (f"req#{n} started | openai-chat stream | 3 messages | "
                       "max output 8,192 | thinking medium | client bench")
    assert done.startswith(f"req#{n} done | openai-chat | stop token | client bench | "
                           "prompt 2,139 | output 54,088 | cache 129 (6.0%) | queue 120 ms | "
                           "TTFT 323 ms | total ")
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
            "client tester | id req_") in text
    assert " done | openai-chat | stop token | client tester | prompt " in text
    for secret in ("SECRET-PROMPT", "SECRET-OUTPUT", "sekrit-key"):
        assert secret not in text


def test_durations_and_listening_line():
    assert duration(0.3234) == "323 ms"
    assert duration(21.04) == "21.0s"
    assert duration(321.0) == "5m 21.0s"
    assert duration(3723.0) == "1h 02m 03.0s"
    assert listening_line("127.0.0.1", 8080, "capy-flash", False) == (
        "listening on http://127.0.0.1:8080 | model capy-flash | auth disabled")


def test_throughput_line_covers_its_own_interval():
    assert throughput_line(EngineStats(at=0.0, state="ready")) is None
    before = EngineStats(at=100.0, state="ready", started_at=50.0,
                         counters=Counters(decode_tokens=47, steps=40, batch_rows=40,
                                           prefix_cache_queries=3, prefix_cache_hits=1))
    stats = replace(
        before, at=105.0,
        # the engine's own last interval says something else: the line must not use it
        throughput=Throughput(decode_tok_s=1.2, batch=1.0, interval_s=1.6, decode_tokens=2),
        counters=Counters(decode_tokens=1000, steps=500, batch_rows=1000,
                          prefix_cache_queries=4, prefix_cache_hits=3),
        queue=QueueStats(running=(RequestView(id="r1", phase="decode"),),
                         pending=(RequestView(id="r2", phase="paused"),)),
        kv=KvStats(total=100, used=12, lent=3),
    )
    assert throughput_line(stats, before) == (
        "throughput | 5.0s | decode 190.6 tok/s (953 tok) | running 1 (decode-ready 1) | "
        "waiting 1 | batch 2.09 | kv 12% (12/100 pages, lent 3) | prefix hits 75% (3/4 tok)")
    # an expert-slot cache (offloaded experts) adds its figures beside the hit rate
    cached = replace(stats, experts=ExpertStats(slots=96, resident=90, lent_pages=6, hits=900,
                                                misses=100, cpu_share=0.25, cached=90,
                                                bytes_copied=5 * 2**20))
    assert throughput_line(cached, before).endswith(
        " | experts hit 90.0% (90/96 slots, lent 6 pages), cpu 25.0%, copied 5 MiB")
    # after a reload the counters restart: the interval starts at the new engine's start
    reloaded = replace(stats, started_at=104.0, counters=Counters(decode_tokens=10, steps=10,
                                                                   batch_rows=10))
    assert throughput_line(reloaded, before).startswith(
        "throughput | 1.0s | decode 10.0 tok/s (10 tok)")
    # a failed engine says nothing, however busy it was
    assert throughput_line(replace(stats, state="failed"), before) is None


def test_throughput_is_logged_every_interval_while_busy(serve, caplog):
    engine = FakeEngine()
    calls = iter(range(1_000_000))

    def busy() -> EngineStats:  # one decode token per 0.25 s of snapshot clock, per call
        n = next(calls)
        return EngineStats(at=n * 0.25, state="ready", counters=Counters(decode_tokens=n))

    engine.snapshot = busy
    with caplog.at_level(logging.INFO, logger="ninfer"):
        serve(engine, log_stats_interval_ms=50)
        for _ in range(100):
            if any(r.getMessage().startswith("throughput | ") for r in caplog.records):
                break
            time.sleep(0.02)
    assert any(r.getMessage().startswith("throughput | 0.2s | decode 4.0 tok/s (1 tok)")
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


def test_startup_summary_line():
    """Headless startup: one line with version, model, devices and dtype, the KV pool, the
    limits, the load time and free memory, in human units."""
    from sample_stats import GIB, busy_stats

    from ninfer_http.shutdown import startup_line, version

    stats = replace(busy_stats(), dtype="bf16")
    devices = tuple(replace(d, free=int(2.5 * GIB)) for d in stats.devices)
    config = replace(FAKE_CONFIG, max_context=32768, max_concurrency=4, max_pending_requests=16,
                     pending_timeout_ms=30000, drain_timeout_ms=10000)
    line = startup_line(replace(stats, devices=devices), config, 12.34)
    assert line == (
        f"ready | ninfer {version()} | model fake-model | device cuda:0, cuda:1 (bf16) | "
        "KV 25,600 tokens (400 pages of 64, int8, 6.0 GiB) | "
        "limits context 32,768, concurrency 4, queue 16 (30 s), drain 10 s | loaded in 12.3 s | "
        "RAM free 48.0 GiB of 128.0 GiB | VRAM free 2.5 GiB")
