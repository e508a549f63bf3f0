"""The hybrid family served by the Engine: greedy equals HF, prefix reuse, no leaks."""
from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import seeded_prompt
from .hybrid_helpers import HybridArtifact, hf_greedy

pytest.importorskip("transformers.models.qwen3_5_moe")

GREEDY = SamplingParams(temperature=0.0)


def _engine(artifact, **overrides) -> Engine:
    # fp32 on CUDA too: these tests compare tokens exactly with fp32 transformers
    fields = {"prefill_chunk": 64, "max_context": 1024, "cuda_dtype": "fp32", **overrides}
    engine = Engine(EngineConfig(artifact=Path("tiny.ninfer"), **fields), artifact)
    engine.start()
    return engine


async def _collect(engine, request):
    return [event async for event in engine.submit(request)]


def _generate(engine, prompt, max_tokens, rid="r"):
    events = asyncio.run(_collect(engine, GenerationRequest(rid, prompt, GREEDY, max_tokens)))
    return [i for e in events for i in e.token_ids], events[-1]


class _Counting:
    """Wraps the runner: counts the tokens the model actually computes."""

    def __init__(self, engine: Engine) -> None:
        self.computed = 0
        self._forward = engine.runner.forward
        engine.runner.forward = self

    def __call__(self, batch):
        self.computed += len(batch.decode) + batch.prefill_tokens
        return self._forward(batch)


@pytest.fixture(scope="module")
def dense():
    return HybridArtifact("qwen3_5")


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_equals_hf_after_chunked_prefill(family, dense):
    artifact = dense if family == "qwen3_5" else HybridArtifact(family)
    prompt = seeded_prompt(200, seed=2)
    engine = _engine(artifact)  # 200 tokens prefill as chunks of 64, 64, 64, 8
    try:
        ours, final = _generate(engine, prompt, 64)
    finally:
        engine.stop()
    assert final.finish == "length" and final.usage.prompt_tokens == 200
    assert ours == hf_greedy(artifact.hf, list(prompt), 64)
    assert len(set(ours)) > 8  # a varied continuation, not one repeated token


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the bf16 CUDA-graph path needs CUDA")
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_cuda_bf16_decode_goes_through_graphs_and_repeats_exactly(family, dense):
    """The serving path on CUDA: bf16, pure-decode steps replayed from CUDA graphs. The same
    greedy request twice gives the same tokens (the second reuses the first's graphs and a
    recycled state slot); the step's numerics are checked in test_hybrid_graphs.py."""
    artifact = dense if family == "qwen3_5" else HybridArtifact(family)
    prompt = seeded_prompt(100, seed=7)
    engine = _engine(artifact, cuda_dtype="bf16")
    try:
        first, final = _generate(engine, prompt, 24, "a")
        again, _ = _generate(engine, prompt, 24, "b")
        graphs = engine.runner.graphs
    finally:
        engine.stop()
    assert graphs is not None and graphs._graphs  # decode steps were replayed graphs
    assert final.finish == "length" and len(first) == 24
    assert again == first


def test_second_turn_computes_only_new_tokens(dense):
    shared = seeded_prompt(150, seed=3)  # not page-aligned: the partial page is copied
    turn2 = shared + seeded_prompt(30, seed=4)
    engine = _engine(dense, device_state_slots=4)  # the prompt's and the answer's ends
    plain = _engine(dense, no_prefix_reuse=True)
    try:
        out1, _ = _generate(engine, shared, 10, "t1")
        counter = _Counting(engine)
        out2, final2 = _generate(engine, turn2, 12, "t2")
        computed2 = counter.computed
        # the next turn of the conversation continues from the end of turn 1's answer
        turn3 = shared + tuple(out1) + seeded_prompt(20, seed=5)
        counter.computed = 0
        out3, final3 = _generate(engine, turn3, 12, "t3")
        computed3 = counter.computed
        ref2, plain2 = _generate(plain, turn2, 12)
        ref3, _ = _generate(plain, turn3, 12)
        hits = engine.snapshot().counters.prefix_cache_hits
    finally:
        engine.stop()
        plain.stop()
    # turn 1's prompt but its last token, snapshotted there so that the same prompt hits too
    assert final2.usage.cached_tokens == 149 and final2.timings.cache_n == 149
    assert final2.timings.prompt_n == 31 and plain2.timings.prompt_n == 180
    assert computed2 == 31 + 11  # new prompt tokens, then 11 decode steps (the 12th is sampled)
    frontier = 150 + 9  # turn 1's prompt and its first 9 answer tokens went through the model
    assert final3.usage.cached_tokens == frontier
    assert computed3 == len(turn3) - frontier + 11
    assert out2 == ref2 and out3 == ref3
    assert hits == 149 + frontier  # prompt tokens restored, over the finished requests


def test_no_leaks_after_random_requests(dense):
    rng = random.Random(0)
    engine = _engine(dense, max_concurrency=3, kv_capacity=640, kv_lease_window=8,
                     device_state_slots=4)
    memory = engine.memory
    pages, slots = memory.allocator.free, memory.free_state_slots
    bases = [seeded_prompt(96, seed=10 + i) for i in range(3)]

    async def one(i: int):
        n = rng.randint(1, 90)
        prompt = bases[i % 3][:n] if rng.random() < 0.5 else seeded_prompt(n, seed=100 + i)
        request = GenerationRequest(f"r{i}", prompt, SamplingParams(seed=i),
                                    rng.randint(1, 10))
        if rng.random() < 0.25:  # the client goes away after its first event
            gen = engine.submit(request)
            await gen.__anext__()
            await gen.aclose()
            return "cancelled"
        return (await _collect(engine, request))[-1].finish

    async def all_requests():
        return await asyncio.gather(*(one(i) for i in range(100)))

    try:
        finishes = asyncio.run(all_requests())
        engine.stop()
        hits = engine.snapshot().counters.prefix_cache_hits
        held = memory.prefix.held_pages()
        in_use = memory.allocator.used
        memory.prefix.clear()
    finally:
        engine.stop()
    assert set(finishes) <= {"length", "cancelled", "stop"} and "cancelled" in finishes
    assert hits > 0  # shared prompt prefixes were restored along the way
    assert in_use == len(held)  # only the prefix tree holds pages once every request is done
    assert memory.allocator.free == pages and memory.free_state_slots == slots
    assert memory.allocator.owners() == 0


def test_snapshot_counts_state_slots_and_checkpoints(dense):
    """The snapshot's state slots: a running request holds one, a finished answer leaves the
    prefix tree's snapshots (each a slot of its own): at the 64-token chunk boundary, one token
    before the prompt's end and at the answer's end; nothing running."""
    engine = _engine(dense, max_concurrency=2, device_state_slots=4)
    try:
        before = engine.snapshot().state_slots
        _generate(engine, seeded_prompt(70, seed=9), 6)
        # the last token reaches the caller before the engine retires the request and
        # publishes the next snapshot: wait (bounded) for that snapshot
        deadline = time.monotonic() + 10
        while engine.snapshot().queue.running and time.monotonic() < deadline:
            time.sleep(0.01)
        after = engine.snapshot().state_slots
    finally:
        engine.stop()
    assert (before.running_total, before.checkpoint_total) == (2, 4)
    assert before.running_used == before.checkpoint_used == before.checkpoints == 0
    assert after.running_used == 0
    assert after.checkpoints == 3 and after.checkpoint_used == 3
