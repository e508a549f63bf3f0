"""The CPU engine builds its tensors on a thread of its own (`cpu_threads`)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ninfer_engine import rank_parts
from ninfer_engine.config import EngineConfig
from ninfer_engine.cpu_threads import run_on_own_thread
from ninfer_engine.engine import Engine, EngineLoadError

from .helpers import FakeArtifact, tiny_llama


def test_run_on_own_thread_returns_or_raises_on_the_caller():
    caller = threading.get_ident()
    assert run_on_own_thread(lambda: threading.get_ident()) != caller

    def boom():
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        run_on_own_thread(boom)


def test_cpu_engine_loads_off_the_callers_thread(device, monkeypatch):
    if device.type != "cpu":
        pytest.skip("the CPU engine only")
    seen = []
    build = rank_parts.build_model

    def recording(*args, **kwargs):
        seen.append(threading.get_ident())
        return build(*args, **kwargs)

    monkeypatch.setattr(rank_parts, "build_model", recording)
    artifact = FakeArtifact(tiny_llama(seed=3, vocab_size=259))
    Engine(EngineConfig(artifact=Path("tiny.ninfer")), artifact)
    assert seen and seen[0] != threading.get_ident()

    def failing(*args, **kwargs):
        raise ValueError("no such tensor")

    monkeypatch.setattr(rank_parts, "build_model", failing)
    with pytest.raises(EngineLoadError, match="no such tensor"):
        Engine(EngineConfig(artifact=Path("tiny.ninfer")), artifact)
