"""Lease rules through the engine (DESIGN §5): FIFO waiting for pages, `length` on exhaustion."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import FakeArtifact, tiny_llama

PROMPT = tuple(range(60))


def _lease_tokens(engine: Engine, prompt: int, max_tokens: int) -> int:
    seq = SimpleNamespace(prompt=(1,) * prompt, request=SimpleNamespace(max_tokens=max_tokens))
    return engine.memory.lease_tokens(seq)


def test_lease_window():
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    windowed = Engine(EngineConfig(artifact=Path("t"), kv_lease_window=16), artifact)
    full = Engine(EngineConfig(artifact=Path("t"), kv_lease_window=0, kv_capacity=512), artifact)
    assert _lease_tokens(windowed, 100, 1000) == 116
    assert _lease_tokens(windowed, 100, 5) == 105
    assert _lease_tokens(full, 100, 300) == 400
    assert _lease_tokens(full, 100, 5000) == 512  # capped at the pool
    assert windowed.snapshot().kv.total == 8192 // 64 and full.snapshot().kv.total == 8


def test_exhausted_pool_ends_with_length_and_admission_waits():
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    config = EngineConfig(artifact=Path("t"), kv_capacity=128, kv_lease_window=1,
                          max_concurrency=3, prefill_chunk=64)
    engine = Engine(config, artifact)
    running: list[int] = []
    pages: list[tuple] = []
    forward = engine.runner.forward

    def recording(batch):
        running.append(len(engine.scheduler.running))
        pages.append(engine.memory.stats(engine.scheduler.running).per_request)
        return forward(batch)

    engine.runner.forward = recording
    engine.start()

    async def three():
        async def one(rid):
            request = GenerationRequest(rid, PROMPT, SamplingParams(temperature=0.0), 100,
                                        ignore_eos=True)
            return [e async for e in engine.submit(request)][-1]

        return await asyncio.gather(one("a"), one("b"), one("c"))

    try:
        with torch.inference_mode():
            a, b, c = asyncio.run(three())
    finally:
        engine.stop()
    # a and b lease one page each (61 tokens); neither can grow past 64 tokens
    assert (a.finish, a.usage.completion_tokens) == ("length", 5)
    assert (b.finish, b.usage.completion_tokens) == ("length", 5)
    # c waited (2 pages, 3 slots) and then grew into the whole pool: 128 - 60 + 1 tokens
    assert max(running) == 2
    assert (c.finish, c.usage.completion_tokens, c.error) == ("length", 69, None)
    assert max(n for step in pages for _, n in step) == 2


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8", "nvfp4", "k8v4"])
def test_quantized_kv_serves(kv_dtype):
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    engine = Engine(EngineConfig(artifact=Path("t"), kv_dtype=kv_dtype, prefill_chunk=16),
                    artifact)
    engine.start()

    async def one():
        request = GenerationRequest("q", PROMPT, SamplingParams(temperature=0.0), 8,
                                    ignore_eos=True)
        return [e async for e in engine.submit(request)][-1]

    try:
        final = asyncio.run(one())
        snapshot = engine.snapshot()
    finally:
        engine.stop()
    assert (final.finish, final.usage.completion_tokens) == ("length", 8)
    assert snapshot.kv.dtype == kv_dtype
