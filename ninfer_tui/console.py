"""The console start: the Textual app, the engine load and the HTTP server on one event loop.

The server listens at once (503 until the engine is READY); the engine loads in a worker
thread; the log goes to a ring buffer the console's log panel shows, never to the terminal
the console draws on. Quitting (`q`, ctrl+q) or SIGTERM drains (`--drain-timeout-ms`; a second
SIGTERM cuts the drain short), stops the server and the engine and exits 0.
"""
from __future__ import annotations

import asyncio
import collections
import io
import logging
import signal
from collections.abc import Mapping, Sequence
from multiprocessing import resource_tracker

from ninfer_engine.config import EngineConfig
from ninfer_engine.cli.flag_table import PROFILES
from ninfer_engine.stats import EngineStats
from ninfer_engine.supervisor import Supervisor
from ninfer_http.app import create_app
from ninfer_http.admission import SLOTS
from ninfer_http.logs import configure_logging
from ninfer_http.request_log import SERVER_ARGV
from ninfer_http.server import RunningServer, start_server
from ninfer_http.shutdown import graceful_stop, stopped_line

from .app import NinferConsole
from .gpu import GpuMonitor

log = logging.getLogger("ninfer")
LOG_LINES = 500


class LogRing(io.TextIOBase):
    """A text stream that keeps the last lines written to it."""

    def __init__(self, size: int = LOG_LINES) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=size)

    def write(self, text: str) -> int:
        self.lines.extend(line for line in text.splitlines() if line)
        return len(text)


class ConsoleBridge:
    """The `ConsoleSupervisor` view of a `Supervisor` plus where the server listens."""

    def __init__(self, supervisor: Supervisor, config: EngineConfig, ring: LogRing) -> None:
        self._supervisor = supervisor
        self._ring = ring
        self.listen_url = f"http://{config.host}:{config.port}"
        self.auth_enabled = config.api_key is not None
        self.artifact = str(config.artifact)
        self.drain_s = config.drain_timeout_ms / 1000

    @property
    def profile(self) -> str | None:
        return self._supervisor.profile

    @property
    def profiles(self) -> Mapping[str, Sequence[str]]:
        return PROFILES

    @property
    def paused(self) -> bool:
        return self._supervisor.paused

    def snapshot(self) -> EngineStats:
        return self._supervisor.snapshot()

    def check_profile(self, name: str) -> str | None:
        return self._supervisor.check_profile(name)

    def reload(self, profile: str | None = None) -> None:
        log.info("reloading the engine%s", f" with profile {profile}" if profile else "")
        self._supervisor.reload(profile)
        log.info("engine ready | model %s", self._supervisor.model_id)

    def pause_admission(self) -> None:
        self._supervisor.pause_admission()
        log.info("admission paused")

    def resume_admission(self) -> None:
        self._supervisor.resume_admission()
        log.info("admission resumed")

    def cancel(self, request_id: str) -> bool:
        cancelled = self._supervisor.cancel(request_id)
        if cancelled:
            log.info("request %s cancelled by the operator", request_id)
        return cancelled

    def log_lines(self) -> list[str]:
        return list(self._ring.lines)


class ServingConsole(NinferConsole):
    """The console that also owns the server and the first engine load."""

    def __init__(self, argv: list[str], supervisor: Supervisor, config: EngineConfig,
                 ring: LogRing) -> None:
        super().__init__(ConsoleBridge(supervisor, config, ring),
                         title_info=f"ninfer {config.artifact.name}", gpu_monitor=GpuMonitor())
        self._argv = argv
        self._engine_supervisor = supervisor
        self._config = config
        self._server: RunningServer | None = None
        self._cut_drain = asyncio.Event()  # set by a second SIGTERM: end the drain wait now
        self.start_error: str | None = None

    async def on_mount(self) -> None:
        try:
            app = create_app(self._engine_supervisor, self._config)
            app[SERVER_ARGV] = self._argv
            self._server = await start_server(app, self._config.host, self._config.port)
        except OSError as exc:
            self.start_error = str(exc)
            self.exit(return_code=1)
            return
        # Textual leaves SIGTERM to Python's default (die mid-request, terminal left raw)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminate)
        self.run_worker(self._load, thread=True, exit_on_error=False, group="load")

    def _terminate(self) -> None:
        """SIGTERM: the same drain as `q` (no question asked); a second one cuts it short."""
        if any(w.group == "quit" for w in self.workers):
            self._cut_drain.set()
            return
        log.info("SIGTERM received")
        self.quit_gracefully()

    def _load(self) -> None:
        try:
            self._engine_supervisor.load()
            log.info("engine ready | model %s", self._engine_supervisor.model_id)
        except Exception as exc:  # shown as FAILED in the console; the reload key retries
            log.error("cannot load %s: %s", self._config.artifact, exc)

    def quit_gracefully(self) -> None:
        """Drain (the console stays up and shows it), then exit."""
        if any(w.group == "quit" for w in self.workers):
            return
        self.run_worker(self._drain_and_exit(), group="quit", exit_on_error=False)

    async def _drain_and_exit(self) -> None:
        server, self._server = self._server, None
        slots = server.runner.app[SLOTS] if server is not None else None
        cut = await graceful_stop(self._engine_supervisor, server,
                                  lambda: slots.in_use if slots else 0,
                                  self._config.drain_timeout_ms / 1000, skip=self._cut_drain)
        log.info(stopped_line(cut))
        self.exit()

    async def on_unmount(self) -> None:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        if self._server is not None:  # left without a drain (e.g. a test's app.exit())
            await self._server.stop()
        self._engine_supervisor.stop()
        if self.gpu_monitor is not None:
            self.gpu_monitor.close()


def run_console(argv: list[str], config: EngineConfig) -> int:
    # an engine in its own process (CUDA's default) is spawned through multiprocessing, whose
    # resource tracker, started on first use, hands on sys.stderr's descriptor: under
    # Textual's output capture that is -1 and the spawn fails ("bad value(s) in
    # fds_to_keep"), so the tracker starts here, while stderr is still the terminal's
    resource_tracker.ensure_running()
    ring = LogRing()
    configure_logging(config.log_level, stream=ring)
    supervisor = Supervisor(argv)
    app = ServingConsole(argv, supervisor, config, ring)
    code = app.run()
    if app.start_error:
        print(f"ninfer-serve: error: {app.start_error}", flush=True)
        return 1
    return code or 0
