"""The graceful stop shared by the console's quit and headless SIGINT/SIGTERM, and the startup
summary line.

`graceful_stop`: the supervisor drains (new requests 503, waiting ones 503 at once, running ones
up to `--drain-timeout-ms`), the engine stops (what still runs ends with an in-band 503 error),
the handlers get a moment to send those bytes, the server closes, and only then the last line
is logged: nothing is logged after it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from importlib import metadata
from typing import Protocol

from ninfer_engine.config import EngineConfig
from ninfer_engine.stats import EngineStats

from .logs import count, size

log = logging.getLogger("ninfer.http")
FLUSH_S = 2.0  # after the engine stopped: how long handlers may take to send their last bytes
POLL_S = 0.05


class Drainable(Protocol):
    cut_off: int  # requests `stop()` ended with an error

    def refuse(self) -> None: ...
    def drain(self, timeout_s: float) -> int: ...
    def stop(self) -> None: ...


class Closable(Protocol):
    async def stop(self) -> None: ...


async def graceful_stop(supervisor: Drainable, server: Closable | None, in_flight,
                        drain_s: float, skip: asyncio.Event | None = None) -> int:
    """Drain, stop the engine, close the server; returns how many requests were cut off.

    `in_flight()` counts the requests whose handlers still run; `skip`, once set, ends the
    drain wait early (a second signal)."""
    loop = asyncio.get_running_loop()
    # refused before the line is logged: a request sent after it must not reach the engine
    # (the drain below runs on another thread; a request could slip in before it closed)
    supervisor.refuse()
    log.info("shutting down | draining up to %s", _seconds(drain_s))
    drain = loop.run_in_executor(None, supervisor.drain, drain_s)
    waiters = [asyncio.ensure_future(drain)]
    if skip is not None:
        waiters.append(asyncio.ensure_future(skip.wait()))
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters[1:]:
        waiter.cancel()
    if not drain.done():
        log.warning("second signal: ending the drain now")
    await loop.run_in_executor(None, supervisor.stop)  # running requests end with an error
    deadline = time.monotonic() + FLUSH_S
    while in_flight() and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    if server is not None:
        await server.stop()
    return supervisor.cut_off


def stopped_line(cut: int) -> str:
    ended = f"{cut} running requests ended with 503" if cut else "no request was cut off"
    return f"stopped | {ended}"


def _seconds(s: float) -> str:
    return f"{s:g} s"


def version() -> str:
    try:
        return metadata.version("ninfer")
    except metadata.PackageNotFoundError:
        return "unknown"


def startup_line(stats: EngineStats, config: EngineConfig, load_s: float) -> str:
    """One line that says what serves, where, within which limits, after how long."""
    kv = stats.kv
    devices = ", ".join(d.name for d in stats.devices) or "cpu"
    groups = [
        f"ready | ninfer {version()}",
        f"model {stats.model_id}",
        f"device {devices}" + (f" ({stats.dtype})" if stats.dtype else ""),
        f"KV {count(kv.total * kv.page_tokens)} tokens ({count(kv.total)} pages of "
        f"{kv.page_tokens}, {kv.dtype}, {size(sum(d.kv_pool for d in stats.devices))})",
        f"limits context {count(config.max_context)}, concurrency {config.max_concurrency}, "
        f"queue {config.max_pending_requests} ({_seconds(config.pending_timeout_ms / 1000)}), "
        f"drain {_seconds(config.drain_timeout_ms / 1000)}",
        f"loaded in {load_s:.1f} s",
        f"RAM free {size(stats.host.total - stats.host.used)} of {size(stats.host.total)}",
    ]
    if stats.devices and stats.devices[0].name.startswith("cuda"):
        groups.append(f"VRAM free {size(stats.devices[0].free)}")
    if stats.engine_pid and stats.engine_pid != os.getpid():
        groups.append(f"engine process {stats.engine_pid}")
    return " | ".join(groups)
