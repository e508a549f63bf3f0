"""Lease rules through the engine (DESIGN §5): FIFO waiting for pages, `length` on exhaustion."""
from __future__ import annotations

import asyncio
import threading
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
    # and at the context: a pool of several contexts once leased one request past its decode
    # step's page table (a 1024-token prompt + 1067 out at max_context 1216 on the H200)
    short = Engine(EngineConfig(artifact=Path("t"), kv_lease_window=0, kv_capacity=1024,
                                max_context=200), artifact)
    assert _lease_tokens(short, 100, 5000) == 256  # 4 pages of 64 hold the 200 positions
    assert windowed.snapshot().kv.total == 8192 // 64 and full.snapshot().kv.total == 8


@pytest.mark.parametrize("elastic", [False, True])
def test_exhausted_pool_ends_with_length_and_admission_waits(elastic):
    # elastic: the pool starts at one page and grows a page at a time up to the same two pages,
    # so admission waits only once the capacity is reached, exactly like the fixed pool
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    config = EngineConfig(artifact=Path("t"), kv_capacity=128, kv_lease_window=1,
                          max_concurrency=3, prefill_chunk=64, elastic=elastic, kv_grow=64)
    engine = Engine(config, artifact)
    assert engine.memory.allocator.total == (1 if elastic else 2)  # pages grown into
    assert engine.snapshot().kv.total == 2 and engine.snapshot().kv.free == 2  # the capacity
    running: list[int] = []
    pages: list[tuple] = []
    forward = engine.runner.forward
    # the engine thread steps while requests are still being submitted: without this, a slow
    # event loop (a loaded 2-core CI box) let `a` run alone into the second page before `b`
    # and `c` arrived, and the roles below swapped
    queued = threading.Event()

    def recording(batch):
        if engine.scheduler.running:
            assert queued.wait(10), "the three requests were not submitted"
        running.append(len(engine.scheduler.running))
        pages.append(engine.memory.stats(engine.scheduler.running).per_request)
        return forward(batch)

    engine.runner.forward = recording
    engine.start()

    async def three():
        streams = [engine.submit(GenerationRequest(rid, PROMPT, SamplingParams(temperature=0.0),
                                                   100, ignore_eos=True)) for rid in "abc"]
        queued.set()

        async def last(stream):
            return [e async for e in stream][-1]

        return await asyncio.gather(*map(last, streams))

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
    assert engine.snapshot().kv.total == 2


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


def _page_bytes(engine: Engine) -> int:
    """K + V of one 64-token page over every attention layer, in the activation dtype."""
    layers, heads, dim = engine.model.kv_layout()
    return 2 * layers * 64 * heads * dim * engine.model.dtype.itemsize


def test_budget_ends_one_request_with_length_while_others_continue():
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    probe = Engine(EngineConfig(artifact=Path("t"), elastic=True), artifact)
    page_bytes = _page_bytes(probe)
    assert probe.memory.storage.page_bytes == page_bytes
    config = EngineConfig(artifact=Path("t"), elastic=True, kv_grow=128, kv_capacity=1024,
                          kv_budget_gib=2 * page_bytes / 2**30, kv_lease_window=1,
                          max_concurrency=3, prefill_chunk=64)
    engine = Engine(config, artifact)
    assert engine.memory.budget_tokens == 128
    running: list[set[str]] = []
    forward = engine.runner.forward

    def recording(batch):
        running.append({s.id for s in engine.scheduler.running})
        return forward(batch)

    engine.runner.forward = recording
    engine.start()

    async def three():
        async def one(rid, prompt, max_tokens):
            request = GenerationRequest(rid, prompt, SamplingParams(temperature=0.0),
                                        max_tokens, ignore_eos=True)
            return [e async for e in engine.submit(request)][-1]

        return await asyncio.gather(one("a", PROMPT, 100), one("b", (5,) * 4, 100),
                                    one("c", (7,) * 200, 8))

    try:
        with torch.inference_mode():
            a, b, c = asyncio.run(three())
        snapshot = engine.snapshot()
    finally:
        engine.stop()
    # a stops at its two-page budget (128 - 60 + 1 tokens) though the pool has 16 pages
    assert (a.finish, a.usage.completion_tokens, a.error) == ("length", 69, None)
    # b (4 + 100 tokens) fits its budget and keeps decoding after a is gone
    assert (b.finish, b.usage.completion_tokens, b.error) == ("length", 100, None)
    assert {"a", "b"} in running and running[-1] == {"b"}
    # c's prompt alone is over the budget: refused at admission
    assert (c.finish, c.error.code, c.error.status) == ("error", "context_length_exceeded", 400)
    assert snapshot.kv.total <= 16 and snapshot.kv.lent == 0


def test_no_pages_leak_after_random_requests_with_growth():
    import random

    rng = random.Random(3)
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    probe = Engine(EngineConfig(artifact=Path("t"), elastic=True), artifact)
    config = EngineConfig(artifact=Path("t"), elastic=True, kv_grow=128, kv_capacity=512,
                          kv_budget_gib=5 * _page_bytes(probe) / 2**30, kv_lease_window=16,
                          max_concurrency=3, prefill_chunk=32)
    engine = Engine(config, artifact)
    totals: list[int] = []
    forward = engine.runner.forward

    def recording(batch):
        totals.append(engine.memory.allocator.total)
        return forward(batch)

    engine.runner.forward = recording
    engine.start()
    requests = [GenerationRequest(f"r{i}", tuple(rng.randrange(259)
                                                 for _ in range(rng.randint(1, 160))),
                                  SamplingParams(temperature=0.0), rng.randint(1, 250),
                                  ignore_eos=True) for i in range(12)]

    async def many():
        async def one(request):
            return [e async for e in engine.submit(request)][-1]

        return await asyncio.gather(*map(one, requests))

    try:
        with torch.inference_mode():
            finals = asyncio.run(many())
    finally:
        engine.stop()
    assert all(f.finish == "length" and f.error is None for f in finals)
    short = [f.usage.completion_tokens < r.max_tokens for f, r in zip(finals, requests)]
    assert any(short) and not all(short)  # some hit the budget or the full pool
    assert set(totals) <= {2, 4, 6, 8} and len(set(totals)) > 1  # grew in steps, to the cap
    allocator = engine.memory.allocator
    assert engine.memory.prefix.pages > 0 and allocator.used > 0  # the prefix tree's pages
    engine.memory.prefix.clear()  # ... and are the only owners left
    assert allocator.free == allocator.total and allocator.owners() == 0
