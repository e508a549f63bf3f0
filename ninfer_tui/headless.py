"""Headless serving (`--no-tui`, systemd, any start without a TTY). Never imports Textual.

Loads the engine and serves HTTP (the app logs `listening on …` and one `throughput` line per
interval from `EngineStats`). Exits 0 on SIGINT/SIGTERM, 1 on a startup failure, and 2 within
250 ms of an engine-wide failure.
"""
from __future__ import annotations

import asyncio
import logging
import signal

from ninfer_engine.config import EngineConfig
from ninfer_engine.stats import EngineStats
from ninfer_engine.supervisor import Supervisor
from ninfer_http.app import create_app
from ninfer_http.logs import configure_logging
from ninfer_http.request_log import SERVER_ARGV
from ninfer_http.server import start_server

log = logging.getLogger("ninfer")

FAILURE_WATCHDOG_S = 0.25


def run_headless(argv: list[str], config: EngineConfig) -> int:
    configure_logging(config.log_level)
    return asyncio.run(_serve(argv, config))


async def _serve(argv: list[str], config: EngineConfig) -> int:
    loop = asyncio.get_running_loop()
    failed = asyncio.Event()
    supervisor = Supervisor(argv, on_failure=lambda _: loop.call_soon_threadsafe(failed.set))
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
    log.info(capacity_line(supervisor.snapshot()))

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
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
    log.info("shutting down")
    await server.stop()
    await loop.run_in_executor(None, supervisor.stop)
    return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def capacity_line(stats: EngineStats) -> str:
    kv = stats.kv
    runtime = ", ".join(d.name for d in stats.devices) or "cpu"
    return (f"capacity | KV {kv.total * kv.page_tokens:,} tokens, {kv.dtype} | "
            f"pages {kv.used}/{kv.total} | runtime {runtime} | "
            f"free {stats.host.total - stats.host.used:,} B RAM")
