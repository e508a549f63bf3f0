"""Headless serving (`--no-tui`, systemd, any start without a TTY). Never imports Textual.

Loads the engine and serves HTTP (the app logs `listening on …`, then one `ready` summary line,
one line per request and one `throughput` line per interval from `EngineStats`). SIGINT or
SIGTERM drains (`--drain-timeout-ms`; a second signal cuts it short) and exits 0; a startup
failure exits 1, an engine-wide failure exits 2 within 250 ms.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time

from ninfer_engine.config import EngineConfig
from ninfer_engine.supervisor import Supervisor
from ninfer_http.admission import SLOTS
from ninfer_http.app import create_app
from ninfer_http.logs import configure_logging
from ninfer_http.request_log import SERVER_ARGV
from ninfer_http.server import start_server
from ninfer_http.shutdown import graceful_stop, startup_line, stopped_line

log = logging.getLogger("ninfer")

FAILURE_WATCHDOG_S = 0.25


def run_headless(argv: list[str], config: EngineConfig) -> int:
    configure_logging(config.log_level)
    return asyncio.run(_serve(argv, config))


async def _serve(argv: list[str], config: EngineConfig) -> int:
    loop = asyncio.get_running_loop()
    failed = asyncio.Event()
    supervisor = Supervisor(argv, on_failure=lambda _: loop.call_soon_threadsafe(failed.set))
    began = time.monotonic()
    try:
        await loop.run_in_executor(None, supervisor.load)
    except Exception as exc:  # any load failure is a startup failure: one line, exit 1
        message = _one_line(exc)
        if str(config.artifact) not in message:  # the engine's own load error names the file
            message = f"cannot load {config.artifact}: {message}"
        log.error("%s", message)
        return 1
    try:
        app = create_app(supervisor, config)
        app[SERVER_ARGV] = argv
        server = await start_server(app, config.host, config.port)
    except OSError as exc:
        log.error("%s", _one_line(exc))
        await loop.run_in_executor(None, supervisor.stop)
        return 1
    log.info(startup_line(supervisor.snapshot(), config, time.monotonic() - began))

    stop, again = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (again if stop.is_set() else stop).set())
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(failed.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in waiters:
        task.cancel()
    if failed.is_set():
        # Queued and running requests already got their 503; give their bytes a moment to leave.
        await asyncio.sleep(FAILURE_WATCHDOG_S / 2)
        log.critical("engine unavailable after an engine-wide failure: %s (exit status 2)",
                     supervisor.failure)
        await server.stop()
        supervisor.stop()
        return 2
    slots = app[SLOTS]
    cut = await graceful_stop(supervisor, server, lambda: slots.in_use,
                              config.drain_timeout_ms / 1000, skip=again)
    log.info(stopped_line(cut))  # the last line: the server and the engine are gone
    return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
