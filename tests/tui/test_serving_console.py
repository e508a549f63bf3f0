"""The console wired to a real `Supervisor` and a live HTTP server: a failed load shows as
FAILED with `/health` 503, and the reload key brings the engine back in the same process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ninfer_engine.stats import EngineStats
from ninfer_engine.supervisor import Supervisor
from ninfer_engine.types import EngineState, SamplingParams
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
        return EngineStats(at=time.time(), state=self.state.value, model_id=self.model_id)


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


def serving_console(tmp_path: Path, factory: Factory) -> tuple[ServingConsole, Supervisor]:
    argv = [str(tmp_path / "m.ninfer"), "--no-tui"]
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
        factory.engines[0].fail("step loop broke")
        await wait_state(app, pilot, "failed")
        assert await asyncio.to_thread(health, port) == 503
        assert "step loop broke" in (supervisor.failure or "")
        await pilot.press("r")
        await wait_state(app, pilot, "ready")
        assert factory.engines[0].stopped and len(factory.engines) == 2
        assert await asyncio.to_thread(health, port) == 200


def test_headless_never_imports_textual() -> None:
    import subprocess
    import sys

    code = ("import sys, ninfer_tui.cli, ninfer_tui.headless; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []
