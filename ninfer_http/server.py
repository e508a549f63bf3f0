"""Binding the application to a TCP address, for the CLI and the tests."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from .context import CONFIG, ENGINE
from .logs import listening_line

log = logging.getLogger("ninfer.http")


@dataclass
class RunningServer:
    """A listening server; `port` is the bound port (useful when asked for port 0)."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening, finish in-flight handlers (cancelling streams) and clean up."""
        await self.runner.cleanup()


async def start_server(
    app: web.Application, host: str, port: int, *, shutdown_timeout: float = 5.0
) -> RunningServer:
    """Listen on host:port and log the `listening on` line.

    Handlers are cancelled when their client disconnects, which closes the engine iterator and
    so cancels generation. A bind failure raises `OSError` naming the address.
    """
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = exc.strerror or str(exc)
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {reason}") from exc
    bound_port = next(
        (addr[1] for addr in runner.addresses if isinstance(addr, tuple)), port
    )
    server = RunningServer(runner, host, bound_port)
    if ENGINE in app and CONFIG in app:
        log.info(listening_line(host, bound_port, app[ENGINE].model_id,
                                bool(app[CONFIG].api_key)))
    return server
