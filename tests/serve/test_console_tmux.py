"""The real console in a real terminal: tmux runs `ninfer-serve` on the default model, a chat
request goes in, and the captured pane must show that request and its throughput.

About a minute on a 2-core machine (the model loads, the console starts), so it is in the
default suite; it skips without tmux or the default model.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ninfer_engine.flags import default_artifact

pytestmark = [pytest.mark.model]
SERVE = Path(sys.executable).with_name("ninfer-serve")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-t", session, "-p"], capture_output=True,
                          text=True, timeout=10).stdout


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.fixture()
def console(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    if not default_artifact().is_file():
        pytest.skip(f"default model missing: {default_artifact()} (run ./install.sh)")
    port, session = free_port(), f"ninfer-test-{free_port()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "140", "-y", "44",
                    f"{SERVE} --port {port} --max-concurrency 2"], check=True, timeout=10)
    try:
        yield session, port
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], timeout=10)
        subprocess.run(["tmux", "kill-session", "-t", session], timeout=10)


def chat(port: int, text: str, max_tokens: int) -> dict:
    body = json.dumps({"model": "smollm2-135m-instruct", "max_tokens": max_tokens,
                       "temperature": 0,
                       "messages": [{"role": "user", "content": text}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=180) as response:
        return json.loads(response.read())


def decode_rate(screen: str) -> float:
    line = next((ln for ln in screen.splitlines() if "decode" in ln and "tok/s" in ln), "")
    try:
        return float(line.split("decode")[1].split("tok/s")[0])
    except (IndexError, ValueError):
        return 0.0


def test_console_shows_a_served_request_and_its_throughput(console):
    session, port = console
    assert wait_for(lambda: "READY" in pane(session), 300), pane(session)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, port, "Tell me a long story about a lighthouse keeper.", 96)
        # while the request runs: it is listed in decode, and the decode rate is live
        assert wait_for(lambda: "decode" in pane(session).split("running (1)")[-1]
                        and decode_rate(pane(session)) > 0, 120), pane(session)
        result = answer.result(timeout=180)
    generated = result["usage"]["completion_tokens"]
    assert wait_for(lambda: "1 done" in pane(session), 10), pane(session)
    assert f"generated {generated} tok" in pane(session)
