"""`ninfer-serve` checks the artifact's recorded payload digest at load: a corrupt payload refuses
to start (one line, exit 1), `--no-verify` skips the check, a file without a digest still loads.

The real `ninfer-serve --no-tui` on a tiny converted GGUF (loads in about a second), on a free
port of 127.0.0.1, with bounded waits."""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ninfer_engine.artifact import framing, verify
from ninfer_engine.cli.flags import parse_args
from tests.artifact.builders import rewrite_root
from tests.artifact.tiny_gguf import convert_tiny

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0  # a busy 2-core machine; the tiny model itself loads in ~1 s


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return convert_tiny(tmp_path_factory.mktemp("verify"))


@pytest.fixture
def corrupt(converted, tmp_path) -> Path:
    """A copy of the tiny model with one payload bit flipped (its structure still valid)."""
    data = bytearray(converted.read_bytes())
    start = framing.payload_start(framing.HEADER.unpack(bytes(data[:32]))[1])
    data[start + (len(data) - start) // 2] ^= 0x01
    path = tmp_path / "corrupt.ninfer"
    path.write_bytes(bytes(data))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(model: Path, *flags: str, port: int | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "NINFER_FAULT"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "ninfer_tui.cli", str(model), "--no-tui", "--host", "127.0.0.1",
         "--port", str(port or free_port()), "--max-context", "256",
         "--log-stats-interval-ms", "0", *flags],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_and_stop(model: Path, *flags: str) -> tuple[int, str]:
    """Serve until /health answers 200, then SIGTERM: (exit status, stderr)."""
    port = free_port()
    proc = serve(model, *flags, port=port)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(port):
            assert proc.poll() is None, f"exited {proc.returncode}: {proc.communicate()[1]}"
            assert time.monotonic() < deadline, "not ready in time"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_no_verify_is_a_flag_of_the_table():
    assert parse_args(["m.ninfer"], {}).config.no_verify is False
    assert parse_args(["m.ninfer", "--no-verify"], {}).config.no_verify is True


def refused(model: Path, *flags: str) -> tuple[int, str, str]:
    """Serve a start that must fail: (exit status, stdout, stderr)."""
    proc = serve(model, *flags)
    try:
        out, err = proc.communicate(timeout=START_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return proc.returncode, out, err


def test_a_flipped_payload_byte_refuses_to_start_in_one_line(corrupt):
    """The refusal is one line, the last; before it only the load's own INFO lines, which the
    weights' load may print while the digest is computed beside it (a 2-core CI box printed
    the CPU step's choice in the same millisecond as the refusal)."""
    code, out, err = refused(corrupt)
    assert code == 1
    lines = err.strip().splitlines()
    assert all("  INFO  " in line for line in lines[:-1]), err
    assert f"{corrupt}: payload digest does not match" in lines[-1]
    assert "Traceback" not in err and "listening" not in out + err


def test_no_verify_gets_past_the_check(corrupt):
    code, err = start_and_stop(corrupt, "--no-verify")
    assert code == 0, err
    assert "digest" not in err


def test_the_engine_verifies_a_good_artifact_and_loads_one_without_a_digest(
        converted, tmp_path, caplog):
    """In process (no server start): the same load path `ninfer-serve` takes."""
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine

    caplog.set_level("INFO", logger="ninfer.engine")
    Engine(EngineConfig(artifact=converted, max_context=256))
    assert "payload digest verified" in caplog.text and str(converted) in caplog.text
    caplog.clear()
    legacy = tmp_path / "legacy.ninfer"
    legacy.write_bytes(converted.read_bytes())
    rewrite_root(legacy, lambda root: root["metadata"].pop(verify.DIGEST_KEY))
    Engine(EngineConfig(artifact=legacy, max_context=256))
    assert "digest" not in caplog.text


def test_the_engine_names_the_file_of_a_corrupt_payload(corrupt):
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine, EngineLoadError

    with pytest.raises(EngineLoadError) as caught:
        Engine(EngineConfig(artifact=corrupt, max_context=256))
    assert str(caught.value).startswith(f"{corrupt}: payload digest does not match")
    Engine(EngineConfig(artifact=corrupt, max_context=256, no_verify=True))
