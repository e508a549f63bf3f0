"""Headless serving (`--no-tui`, systemd, any start without a TTY). Never imports Textual.

Loads the engine, serves HTTP, logs `listening on …` and one `throughput` line per interval
from `EngineStats`, exits 0 on SIGINT/SIGTERM, 1 on a startup failure and 2 within 250 ms of
an engine-wide failure.
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
        log.error("cannot load %s: %s", config.artifact, _one_line(exc))
        return 1
    try:
        runner = await start_server(create_app(supervisor, config), config.host, config.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, _one_line(exc))
        supervisor.stop()
        return 1
    log.info("listening on http://%s:%d | model %s | %s", config.host, config.port,
             supervisor.model_id, "auth bearer" if config.api_key else "auth disabled")
    log.info(capacity_line(supervisor.snapshot()))

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stats_task = asyncio.create_task(_log_throughput(supervisor, config.log_stats_interval_ms))
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(failed.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in (*waiters, stats_task):
        task.cancel()
    if failed.is_set():
        # Queued and running requests already got their 503; give their bytes a moment to leave.
        await asyncio.sleep(FAILURE_WATCHDOG_S / 2)
        log.critical("engine unavailable after an engine-wide failure: %s (exit status 2)",
                     supervisor.failure)
        await runner.cleanup()
        supervisor.stop()
        return 2
    log.info("shutting down")
    await runner.cleanup()
    await loop.run_in_executor(None, supervisor.stop)
    return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def capacity_line(stats: EngineStats) -> str:
    kv = stats.kv
    return (f"capacity | KV {kv.total * kv.page_tokens:,} tokens, {kv.dtype} | "
            f"pages {kv.used}/{kv.total} | runtime {'cpu' if not stats.devices else 'cuda'} | "
            f"free {stats.host.total - stats.host.used:,} B RAM")


def throughput_line(prev: EngineStats, cur: EngineStats) -> str | None:
    """The interval line of http-contract §9, or None for an idle interval."""
    interval = cur.at - prev.at
    tokens = cur.counters.generation_tokens - prev.counters.generation_tokens
    running = len(cur.queue.running)
    if interval <= 0 or (tokens == 0 and running == 0):
        return None
    line = (f"throughput | {interval:.1f}s | decode {tokens / interval:.1f} tok/s ({tokens} tok) | "
            f"running {running} | waiting {len(cur.queue.pending)} | "
            f"batch {cur.throughput.batch:.2f} | kv {cur.kv.used}/{cur.kv.total} pages")
    if cur.kv.lent:
        line += f" (lent {cur.kv.lent})"
    return line


async def _log_throughput(supervisor: Supervisor, interval_ms: int) -> None:
    if interval_ms <= 0:
        return
    prev = supervisor.snapshot()
    while True:
        await asyncio.sleep(interval_ms / 1000)
        cur = supervisor.snapshot()
        line = throughput_line(prev, cur)
        if line:
            log.info(line)
        prev = cur
