"""The console wired to a real `Supervisor` and a live HTTP server: a failed load shows as
FAILED with `/health` 503, and the reload key brings the engine back in the same process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ninfer_engine.stats import EngineStats, KvStats, QueueStats, RequestView, Throughput
from ninfer_http.logs import throughput_line
from ninfer_engine.supervisor import Supervisor
from ninfer_engine.types import EngineState, GenerationRequest, SamplingParams
from ninfer_tui.console import LogRing, ServingConsole

pytestmark = pytest.mark.anyio


class StubEngine:
    """Just enough of an engine for the supervisor and the console."""

    model_id = "stub-model"
    max_context = 128
    default_max_tokens = 16
    sampling_defaults = SamplingParams()

    def __init__(self) -> None:
        self.state = EngineState.READY
        self.listeners: list = []
        self.stopped = False
        self.running: tuple[RequestView, ...] = ()  # what the snapshot lists as running

    def add_failure_listener(self, listener) -> None:
        self.listeners.append(listener)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def fail(self, reason: str) -> None:
        self.state = EngineState.FAILED
        for listener in self.listeners:
            listener(reason)

    def snapshot(self) -> EngineStats:
        # live figures, as a busy engine's last snapshot has them (also after it failed)
        return EngineStats(at=time.time(), state=self.state.value, model_id=self.model_id,
                           queue=QueueStats(running=self.running),
                           throughput=Throughput(decode_tok_s=40.0, interval_s=1.0,
                                                 decode_tokens=40),
                           kv=KvStats(total=100, used=30, free=70))


class Factory:
    """Fails the first `failures` loads, then builds stub engines."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.engines: list[StubEngine] = []

    def __call__(self, config) -> StubEngine:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("injected load failure")
        self.engines.append(StubEngine())
        return self.engines[-1]


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


async def wait_state(app: ServingConsole, pilot, state: str, timeout: float = 10.0) -> None:
    """Wait until the console itself (its polled snapshot) shows `state`."""
    deadline = time.monotonic() + timeout
    while app.stats.state != state:
        assert time.monotonic() < deadline, f"still {app.stats.state}"
        await pilot.pause(0.05)


def serving_console(tmp_path: Path, factory: Factory,
                    *flags: str) -> tuple[ServingConsole, Supervisor]:
    argv = [str(tmp_path / "m.ninfer"), "--no-tui", *flags]
    supervisor = Supervisor(argv, engine_factory=factory)
    config = dataclasses.replace(supervisor.config, port=0)  # any free loopback port
    return ServingConsole(argv, supervisor, config, LogRing()), supervisor


async def test_failed_load_then_reload_key(tmp_path: Path) -> None:
    factory = Factory(failures=1)
    app, supervisor = serving_console(tmp_path, factory)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_state(app, pilot, "failed")
        port = app._server.port
        assert await asyncio.to_thread(health, port) == 503
        await pilot.press("r")  # failed: reloads without asking
        await wait_state(app, pilot, "ready")
        assert await asyncio.to_thread(health, port) == 200
        assert len(factory.engines) == 1


async def test_engine_failure_shows_and_reload_replaces_the_engine(tmp_path: Path) -> None:
    factory = Factory(failures=0)
    app, supervisor = serving_console(tmp_path, factory)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_state(app, pilot, "ready")
        port = app._server.port
        assert app.stats.throughput.decode_tok_s == 40.0 and not app.screen.has_class("-stale")
        factory.engines[0].running = (RequestView("r-1", "decode", 5),)
        factory.engines[0].fail("step loop broke")
        await wait_state(app, pilot, "failed")
        assert await asyncio.to_thread(health, port) == 503
        # honest: the failed engine's last figures are cleared, the screen greyed, no log line
        shown = app.stats
        assert shown.throughput == Throughput() and shown.kv.used == 0
        assert shown.queue.running == () and app.screen.has_class("-stale")
        assert throughput_line(shown) is None
        assert "step loop broke" in (supervisor.failure or "")
        await pilot.press("r")
        await wait_state(app, pilot, "ready")
        assert factory.engines[0].stopped and len(factory.engines) == 2
        assert await asyncio.to_thread(health, port) == 200


def get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


async def test_paused_admission_keeps_health_200_and_engine_state_says_paused(
        tmp_path: Path) -> None:
    app, supervisor = serving_console(tmp_path, Factory(failures=0))
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_state(app, pilot, "ready")
        port = app._server.port
        await pilot.press("a")
        assert supervisor.paused
        assert await asyncio.to_thread(health, port) == 200  # paused is not unhealthy
        state = await asyncio.to_thread(get_json, port, "/engine/state")
        assert (state["state"], state["admission"]) == ("ready", "paused")
        await pilot.press("a")
        state = await asyncio.to_thread(get_json, port, "/engine/state")
        assert state["admission"] == "open"


async def test_sigterm_drains_and_a_second_one_cuts_the_drain_short(tmp_path: Path,
                                                                     caplog) -> None:
    """SIGTERM to the console process: the drain `q` runs (no question), a second SIGTERM
    ends the drain wait, the engine stops and the console exits 0."""
    caplog.set_level("INFO", logger="ninfer")
    factory = Factory(failures=0)
    app, supervisor = serving_console(tmp_path, factory, "--drain-timeout-ms", "600000")
    unhandled: list[int] = []
    # a console without its own handler fails here instead of killing the test process
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: unhandled.append(sig))
    try:
        async with app.run_test(size=(140, 44)) as pilot:
            await wait_state(app, pilot, "ready")
            factory.engines[0].running = (RequestView("r-1", "decode", 5),)  # never ends
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while "shutting down" not in caplog.text:
                assert time.monotonic() < deadline and not unhandled, caplog.text
                await pilot.pause(0.05)
            await pilot.pause(0.5)
            assert app.return_code is None, "exited before its drain ran out"
            assert supervisor.gate.state == "draining" and not factory.engines[0].stopped
            os.kill(os.getpid(), signal.SIGTERM)
            while app.return_code is None:
                assert time.monotonic() < deadline, caplog.text
                await pilot.pause(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not unhandled
    assert app.return_code == 0 and factory.engines[0].stopped
    assert "second signal: ending the drain now" in caplog.text
    assert caplog.records[-1].getMessage().startswith("stopped | ")  # nothing after it


async def test_paused_waiters_are_listed_cancelled_by_the_operator_and_ended_by_a_drain(
        tmp_path: Path) -> None:
    """At a paused gate: a waiter is in the snapshot as "paused"; the operator's cancel ends it
    with 503 `cancelled_by_operator`; a drain ends the others at once with 503."""
    supervisor = Supervisor([str(tmp_path / "m.ninfer")], engine_factory=Factory(failures=0))
    supervisor.load()
    supervisor.pause_admission()

    async def last_event(rid: str):
        request = GenerationRequest(rid, (1, 2, 3), SamplingParams(), max_tokens=4)
        return [event async for event in supervisor.submit(request)][-1]

    waiters = {rid: asyncio.create_task(last_event(rid)) for rid in ("w-1", "w-2")}
    deadline = time.monotonic() + 10
    while len(supervisor.snapshot().queue.pending) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert {(v.id, v.phase) for v in supervisor.snapshot().queue.pending} == {
        ("w-1", "paused"), ("w-2", "paused")}
    assert supervisor.cancel("w-1")
    cancelled = await asyncio.wait_for(waiters["w-1"], 5)
    assert (cancelled.error.code, cancelled.error.status) == ("cancelled_by_operator", 503)
    began = time.monotonic()
    assert await asyncio.to_thread(supervisor.drain, 30.0) == 0  # nothing in the engine
    shut = await asyncio.wait_for(waiters["w-2"], 5)
    assert (shut.error.code, shut.error.status) == ("service_unavailable", 503)
    assert time.monotonic() - began < 5  # at once, not after the drain time
    assert dict(supervisor.snapshot().latency.outcomes) == {"cancelled_by_operator": 1,
                                                            "service_unavailable": 1}
    supervisor.stop()


def test_headless_never_imports_textual() -> None:
    import subprocess
    import sys

    code = ("import sys, ninfer_tui.cli, ninfer_tui.headless; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []
