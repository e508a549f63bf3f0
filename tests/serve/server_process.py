"""The real `ninfer-serve --no-tui` as a subprocess on 127.0.0.1 (free port, default model).

Torch runs one thread per server: the test machine is small and shared. `NEEDS_MODEL` skips
when install.sh has not prepared the default model.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ninfer_engine.cli.flags import default_artifact

ROOT = Path(__file__).resolve().parents[2]
MODEL = default_artifact()
MODEL_ID = "smollm2-135m-instruct"
READY_TIMEOUT_S = 180.0  # loading the model on a busy 2-core machine takes 15-40 s


def serve_command() -> list[str]:
    """The installed entry point of the project venv, else this interpreter's module."""
    script = ROOT / ".venv" / "bin" / "ninfer-serve"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ninfer_tui.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """One `ninfer-serve` child; stderr goes to a file the test can read."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path,
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*serve_command(), *args, "--no-tui", "--host", "127.0.0.1", "--port",
             str(self.port)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> ServerProcess:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.get("/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log()}")

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            headers = {k.lower(): v for k, v in response.getheaders()}
            return response.status, headers, response.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, Any]:
        status, _, body = self.request("GET", path, timeout=5.0)
        return status, json.loads(body)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NINFER_FAULT"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def chat_body(content: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL_ID, "stream": stream, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}


# `pytestmark` of every module here: the real default model, skipped when it is missing.
NEEDS_MODEL = [
    pytest.mark.model,
    pytest.mark.skipif(not MODEL.exists(),
                       reason=f"default model not prepared: {MODEL} is missing (run install.sh)"),
]
