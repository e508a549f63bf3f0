"""The console's figures against the request log and `/metrics` for one scripted load (issue 24):
the real console (`ServingConsole`: its own server and a real `Supervisor` of the default model)
serves a few short requests and one refusal; what its latency and requests panels show must be
the request log's figures in the console's units, and the ends it counts must be `/metrics`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.supervisor import Supervisor
from ninfer_http.logs import configure_logging
from ninfer_tui.console import LogRing, ServingConsole
from ninfer_tui.widgets.format import seconds, short_id
from ninfer_tui.widgets.latency import LatencyPanel
from ninfer_tui.widgets.requests import RequestsPanel

MODEL = default_artifact()
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.model,
    pytest.mark.skipif(not MODEL.exists(), reason=f"default model not prepared: {MODEL}"),
]
MODEL_ID = "smollm2-135m-instruct"
LOAD = (("Name a fruit.", 3), ("What is 2+2?", 4), ("Say hello.", 2))


def post(port: int, body: dict) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def shown(panel) -> list[str]:
    """The panel's body as the screen shows it, line by line."""
    console = Console(width=panel.size.width, record=True, color_system=None)
    console.print(panel.render())
    return console.export_text().splitlines()


def cells(lines: list[str], first: str) -> list[str]:
    """The cells (two or more spaces apart) of the line that starts with `first`."""
    line = next(line for line in lines if line.strip().startswith(first))
    return re.split(r"\s{2,}", line.strip())[1:]


@contextlib.contextmanager
def logging_to(ring: LogRing):
    """The console's log set-up (`run_console`), undone after: other tests read `ninfer` logs."""
    saved = {name: (lg.handlers[:], lg.level, lg.propagate)
             for name in ("ninfer", "aiohttp") for lg in [logging.getLogger(name)]}
    configure_logging("info", stream=ring)
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(name)
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def done_lines(lines: list[str]) -> dict[str, str]:
    """Request id -> the `done` line of its log trace (the `started` line names the id)."""
    ids = dict(re.findall(r"(req#\d+) started \|.* id (\S+)", "\n".join(lines)))
    return {ids[m.group(1)]: line for line in lines
            if (m := re.search(r"(req#\d+) done \|", line)) and m.group(1) in ids}


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * q)) - 1]


def as_shown(value: float) -> set[str]:
    """The console's text for a request log figure (rounded to 1 µs, either way)."""
    return {seconds(value - 1e-6), seconds(value), seconds(value + 1e-6)}


async def test_console_shows_the_request_log_and_metrics_figures(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    argv = [str(MODEL), "--max-concurrency", "1", "--request-log-jsonl", str(log_path)]
    supervisor = Supervisor(argv)
    config = dataclasses.replace(supervisor.config, port=0)
    ring = LogRing()
    app = ServingConsole(argv, supervisor, config, ring)
    with logging_to(ring):
        async with app.run_test(size=(160, 50)) as pilot:
            latency_lines, request_lines, metrics, statuses, refused = await load(app, pilot)
        log_lines = app.supervisor.log_lines()  # what the log view (`l`) shows
    assert statuses == [200] * len(LOAD) and refused == 404
    check(log_path, latency_lines, request_lines, log_lines, metrics)


async def load(app: ServingConsole, pilot):
    """The scripted load; the two panels' lines and /metrics once the console shows its end."""
    deadline = time.monotonic() + 120
    while app.stats.state != "ready":
        assert time.monotonic() < deadline, f"still {app.stats.state}"
        await pilot.pause(0.1)
    port = app._server.port
    bodies = [{"model": MODEL_ID, "max_tokens": n, "temperature": 0,
               "messages": [{"role": "user", "content": text}]} for text, n in LOAD]
    statuses = [await asyncio.to_thread(post, port, body) for body in bodies]
    refused = await asyncio.to_thread(post, port, {**bodies[0], "model": "no-such-model"})
    ended = len(LOAD) + 1
    while app.stats.latency.requests < ended:  # the console has polled every end
        assert time.monotonic() < deadline + 60, app.stats.latency
        await pilot.pause(0.1)
    await pilot.pause(0.3)
    latency_lines = shown(app.query_one(LatencyPanel))
    request_lines = shown(app.query_one(RequestsPanel))
    metrics = await asyncio.to_thread(scrape, port)
    return latency_lines, request_lines, metrics, statuses, refused


def check(log_path: Path, latency_lines: list[str], request_lines: list[str],
          log_lines: list[str], metrics: dict) -> None:
    ended = len(LOAD) + 1
    events = [json.loads(line) for line in log_path.read_text().splitlines()]
    request_ids = {e["id"]: e["request_id"] for e in events if e["event"] == "request_start"}
    done = {request_ids[e["id"]]: e for e in events if e["event"] == "request_done"}
    rejected = [e for e in events if e["event"] == "request_rejected"]
    assert len(done) == len(LOAD) and len(rejected) == 1

    # the recent table: one row per request, its end, output tokens and TTFT
    for rid, event in done.items():
        row = next(line for line in request_lines if f" {short_id(rid)} " in f" {line} ")
        result = event["result"]
        assert f" {result['finish_reason']} " in row, (row, result)
        assert re.search(rf"\s{result['completion_tokens']}\s", row), (row, result)
        assert any(row.rstrip().endswith(text) for text in as_shown(
            event["timings_seconds"]["ttft"])), (row, event["timings_seconds"])
    # the log view: each request's done line says the same end, output tokens and TTFT
    logged = done_lines(log_lines)
    assert set(logged) == set(done), log_lines
    for rid, event in done.items():
        line, result = logged[rid], event["result"]
        label = {"stop": "stop token", "length": "length limit"}[result["finish_reason"]]
        assert f"| {label} |" in line and f"| output {result['completion_tokens']} |" in line
        ttft_ms = float(re.search(r"\| TTFT (\d+) ms", line).group(1))
        assert abs(ttft_ms / 1000 - event["timings_seconds"]["ttft"]) <= 0.5e-3 + 1e-6, line
    refusal = next(line for line in request_lines
                   if f" {short_id(rejected[0]['request_id'])} " in f" {line} ")
    assert rejected[0]["code"] in refusal

    # the latency block: TTFT and e2e percentiles are the request log's, in the console's units
    ttfts = [e["timings_seconds"]["ttft"] for e in done.values()]
    e2e = [e["engine_timing"]["queue_wait_seconds"] + e["timings_seconds"]["prefill"]
           + e["timings_seconds"]["decode"] for e in done.values()]
    for label, values in (("TTFT", ttfts), ("e2e", e2e)):
        for cell, q in zip(cells(latency_lines, label), (0.5, 0.95, 0.99)):
            assert cell in as_shown(nearest_rank(values, q)), (label, cell, sorted(values))
        kind = label.lower()
        for cell, q in zip(cells(latency_lines, label), ("0.5", "0.95", "0.99")):
            key = ("ninfer:request_latency_window_seconds", (("kind", kind), ("quantile", q)))
            assert seconds(metrics[key]) == cell
    # the ends it counts: /metrics' counters and the request log's events
    ended_text = " ".join(latency_lines)
    assert re.search(rf"\b{ended} ended\b", ended_text), ended_text
    finishes: dict[str, int] = {}
    for event in done.values():
        reason = event["result"]["finish_reason"]
        finishes[reason] = finishes.get(reason, 0) + 1
    for reason, n in finishes.items():
        assert metrics[("ninfer:request_success_total", (("finish_reason", reason),))] == n
        assert re.search(rf"\b{reason} {n}\b", ended_text), (reason, ended_text)
    code = rejected[0]["code"]
    assert metrics[("ninfer:requests_rejected_total", (("code", code),))] == 1
    assert re.search(rf"\b{code} 1\b", ended_text), ended_text
