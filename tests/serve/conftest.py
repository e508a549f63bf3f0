"""`launch`: start real `ninfer-serve` processes; each is killed at the test's end if alive.
`server` (with `client`, the `openai` SDK, and `claude`, the `anthropic` SDK, on it): one
server of the default model for every real-client test module of the session."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import anthropic
import openai
import pytest
from server_process import MODEL, ServerProcess, server_env


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("serve")) / "server.log"
    process = ServerProcess([str(MODEL), "--log-stats-interval-ms", "0", "--log-level", "debug"],
                            server_env(), log)
    try:
        yield process.wait_ready()
    finally:
        process.close()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="session")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=120)


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
