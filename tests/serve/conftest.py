"""`launch`: start real `ninfer-serve` processes; each is killed at the test's end if alive."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from server_process import MODEL, ServerProcess, server_env


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """`launch(*flags, env=None, model=MODEL, port=None)` starts a server (without waiting)."""
    started: list[ServerProcess] = []

    def start(*flags: str, env: dict[str, str] | None = None,
              model: Path = MODEL, port: int | None = None) -> ServerProcess:
        log_path = tmp_path / f"server-{len(started)}.log"
        server = ServerProcess([str(model), "--log-stats-interval-ms", "0", *flags],
                               env or server_env(), log_path, port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
