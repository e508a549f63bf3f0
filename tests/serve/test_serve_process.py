"""Process life of the real `ninfer-serve --no-tui` (contract §4 "Failure", §10 exit codes).

An injected engine-wide fault (`NINFER_FAULT=step:N`) must turn `/health` to 503, end a running
stream with an in-band error and no `[DONE]`, answer queued requests with a plain 503 and exit 2
soon after; startup failures exit 1 with one line; SIGINT and SIGTERM drain (running
requests finish, or end in-band once `--drain-timeout-ms` runs out) and exit 0.
"""
from __future__ import annotations

import asyncio
import re
import signal
import socket
import time
from pathlib import Path

import aiohttp
from server_process import NEEDS_MODEL, chat_body, server_env
from sse_client import chat, continue_chat, open_chat, read_chat, watch_health

pytestmark = NEEDS_MODEL

FAULT_STEP = 40  # well after the queued requests are in the engine queue (polled below)
LONG = "Write a long story about a dragon who learns to fly, with many chapters."
EXIT_BOUND_S = 10.0  # the 250 ms watchdog plus closing the listener, on a busy machine


async def _wait_pending(session: aiohttp.ClientSession, url: str, count: int) -> None:
    for _ in range(500):
        async with session.get(url + "/engine/state") as response:
            state = await response.json()
        if len(state["queue"]["pending"]) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} requests never queued: {state['queue']}")


def test_engine_failure_fails_every_request_and_exits_2(launch):
    server = launch("--max-concurrency", "1", "--max-pending-requests", "2",
                    env=server_env(NINFER_FAULT=f"step:{FAULT_STEP}")).wait_ready()
    url = server.url

    async def scenario():
        health: list[str] = []
        watcher = asyncio.create_task(watch_health(url, health))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            running = await open_chat(session, url, chat_body(LONG, 400))
            started = await read_chat(running, until_content=True)
            queued_stream = asyncio.create_task(chat(session, url, chat_body("Hi", 8)))
            queued_plain = asyncio.create_task(session.post(
                url + "/v1/chat/completions", json=chat_body("Hello", 8, stream=False)))
            await _wait_pending(session, url, 2)
            first = await continue_chat(running, started)
            failed_at = time.monotonic()
            second = await queued_stream
            plain = await queued_plain
            third = (plain.status, plain.headers["Content-Type"], await plain.json())
        await asyncio.wait_for(watcher, timeout=EXIT_BOUND_S)
        return first, second, third, health, failed_at

    first, second, third, health, failed_at = asyncio.run(asyncio.wait_for(scenario(), 180))
    exit_code = server.wait(timeout=EXIT_BOUND_S)
    exited_after = time.monotonic() - failed_at
    log = server.log()

    assert first.status == 200 and first.text, "the running stream started"
    assert first.finish is None and not first.done, f"the stream must not end normally: {first}"
    assert first.error["code"] == "service_unavailable"
    assert "injected engine fault" in first.error["message"]
    assert (second.status, second.error["code"]) == (503, "service_unavailable")
    assert not second.content_type.startswith("text/event-stream")  # queued: plain HTTP
    assert third[0] == 503 and third[1].startswith("application/json")
    assert third[2]["error"]["code"] == "service_unavailable"
    assert health[0] == "200" and "503" in health and health[-1] == "down"
    assert health.index("503") < len(health) - 1
    assert exit_code == 2, log
    assert exited_after < EXIT_BOUND_S
    assert "CRITICAL  engine unavailable after an engine-wide failure" in log
    assert "(exit status 2)" in log


def test_corrupt_artifact_exits_1_with_one_line(launch, tmp_path: Path):
    broken = tmp_path / "broken.ninfer"
    broken.write_bytes(b"NINFER\x00" + bytes(range(256)) * 8)
    server = launch(model=broken)
    assert server.wait(timeout=120) == 1
    lines = [line for line in server.log().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert str(broken) in lines[0] and "Traceback" not in lines[0]


def test_port_in_use_exits_1(launch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = launch(port=taken.getsockname()[1])
        assert server.wait(timeout=180) == 1
    log = server.log()
    assert "cannot listen on 127.0.0.1" in log and "Traceback" not in log


def _lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.strip()]


async def _wait_logged(server, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, server.log()
        await asyncio.sleep(0.05)


def test_sigterm_drain_runs_out_running_requests_end_in_band_and_exit_0(launch):
    """SIGTERM with a stream running and one queued behind it, the drain too short for them:
    new requests get 503 during the drain, the running stream ends with an in-band error (no
    [DONE]), the queued one with a plain 503, exit 0, and `stopped` is the last line even with
    throughput lines on."""
    server = launch("--max-concurrency", "1", "--drain-timeout-ms", "1500",
                    "--log-stats-interval-ms", "500").wait_ready()
    url = server.url

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            running = await open_chat(session, url, chat_body(LONG, 400))
            started = await read_chat(running, until_content=True)
            queued = asyncio.create_task(chat(session, url, chat_body("Hi", 8)))
            await _wait_pending(session, url, 1)
            server.signal(signal.SIGTERM)
            await _wait_logged(server, "shutting down")
            during = await chat(session, url, chat_body("Hello", 4))
            return await continue_chat(running, started), await queued, during

    first, second, during = asyncio.run(asyncio.wait_for(scenario(), 180))
    assert server.wait(timeout=30) == 0, server.log()
    log = server.log()
    assert (during.status, during.error["code"]) == (503, "service_unavailable"), during
    assert first.status == 200 and first.text and first.finish is None and not first.done
    assert first.error["code"] == "service_unavailable", first
    assert (second.status, second.error["code"]) == (503, "service_unavailable"), second
    assert "shutting down | draining up to 1.5 s" in log
    assert _lines(log)[-1].endswith("stopped | 2 running requests ended with 503"), log


def test_sigint_drain_lets_the_running_request_finish_and_exit_0(launch):
    """SIGINT with a short stream running and a long drain: the stream ends normally (finish
    reason and [DONE]) and the server exits right after it, not at the drain's end. The log
    starts with the one-line startup summary."""
    server = launch("--drain-timeout-ms", "600000").wait_ready()
    url = server.url

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            running = await open_chat(session, url, chat_body("Count to twenty.", 24))
            started = await read_chat(running, until_content=True)
            server.signal(signal.SIGINT)
            return await continue_chat(running, started)

    stream = asyncio.run(asyncio.wait_for(scenario(), 180))
    assert server.wait(timeout=60) == 0, server.log()
    assert stream.finish in ("stop", "length") and stream.done and stream.error is None, stream
    log = server.log()
    # the startup summary, once, before any request line
    ready = [i for i, line in enumerate(_lines(log)) if " ready | ninfer " in line]
    assert len(ready) == 1 and ready[0] < min(
        i for i, line in enumerate(_lines(log)) if "req#" in line), log
    assert re.search(r" ready \| ninfer \S+ \| model smollm2-135m-instruct \| device cpu \(fp32\) "
                     r"\| KV [\d,]+ tokens \(\d+ pages of 64, fp32, [\d.]+ MiB\) \| limits context "
                     r"8,192, concurrency 1, queue 16 \(30 s\), drain 600 s \| loaded in [\d.]+ s "
                     r"\| RAM free [\d.]+ GiB of [\d.]+ GiB$", _lines(log)[ready[0]]), log
    assert "shutting down | draining up to 600 s" in log
    assert _lines(log)[-1].endswith("stopped | no request was cut off"), log
