"""A step that raises ends the requests it carried, and the engine serves on (`step_failure`).

The fault is raised after the runner's real forward, so the failed rows' K/V and recurrent state
slots were written past their `cached` (the worst case: the next step can't tell). Afterwards
the engine is READY, a new request and one reusing a failed request's prompt from the prefix tree
give HF's greedy tokens exactly, and every page and state slot is back; likewise for a lookahead
step (the default model). A fault that outlives the rows it carried, or a device error, fails
the engine instead; running out of memory does not. A fault while admitting a request ends
that request and gives its lease back.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from ninfer_engine.artifact import open_artifact
from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.kernels.cpu_decode import cpu_decode_unavailable
from ninfer_engine.step.step_failure import engine_wide
from ninfer_engine.types import EngineState, GenerationRequest, SamplingParams

from .helpers import seeded_prompt
from .hybrid_helpers import HybridArtifact, hf_greedy

pytest.importorskip("transformers.models.qwen3_5_moe")

GREEDY = SamplingParams(temperature=0.0)


class Broken:
    """Wraps the runner's `method` (`forward`, or `forward_from`: a lookahead step): runs it,
    then raises `error` at the steps `when` picks."""

    def __init__(self, engine: Engine, when, error: Exception, method: str = "forward") -> None:
        self.when, self.error, self.raised = when, error, 0
        self.carried: set[str] = set()  # the ids of the requests the broken step carried
        self._forward = getattr(engine.runner, method)
        setattr(engine.runner, method, self)

    def __call__(self, batch, *tokens):
        logits = self._forward(batch, *tokens)
        if self.when(batch):
            self.raised += 1
            self.carried |= {seq.id for seq in [*batch.decode, *(c.seq for c in batch.chunks)]}
            raise self.error
        return logits


def _engine(artifact) -> Engine:
    config = EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=64, max_context=1024,
                          cuda_dtype="fp32", max_concurrency=3, kv_capacity=640,
                          device_state_slots=4)
    engine = Engine(config, artifact)
    engine.start()
    return engine


async def _run(engine: Engine, *requests: GenerationRequest):
    async def one(request):
        return [event async for event in engine.submit(request)]
    return await asyncio.gather(*(one(r) for r in requests))


def _one(engine: Engine, rid: str, prompt: tuple[int, ...], max_tokens: int):
    """The events of one greedy request, run to its end."""
    return asyncio.run(_run(engine, GenerationRequest(rid, prompt, GREEDY, max_tokens)))[0]


def _tokens(events) -> list[int]:
    return [i for e in events for i in e.token_ids]


@pytest.fixture(scope="module")
def dense():
    return HybridArtifact("qwen3_5")


# where the step breaks (once): both requests decoding, their prompts in the tree; or a prompt's
# chunk after its first (the chunks before it in the tree), beside the other's rows
BREAKS = {"decode": lambda batch: len(batch.decode) == 2,
          "later-chunk": lambda batch: any(chunk.seq.cached > 0 for chunk in batch.chunks)}


@pytest.mark.parametrize("where", BREAKS)
def test_a_step_that_raises_ends_its_rows_and_the_engine_serves_on(dense, where):
    engine = _engine(dense)
    memory = engine.memory
    pages, slots = memory.allocator.free, memory.free_state_slots
    a, b, c = seeded_prompt(150, 1), seeded_prompt(45, 2), seeded_prompt(30, 3)
    broken = Broken(engine, lambda batch: BREAKS[where](batch) and not broken.raised,
                    RuntimeError("a kernel broke"))
    try:
        failed = asyncio.run(_run(engine, GenerationRequest("a", a, GREEDY, 20),
                                  GenerationRequest("b", b, GREEDY, 20)))
        state_after_failure = engine.state
        # a new prompt, and the failed `a`'s prompt again (restored from the prefix tree)
        served = asyncio.run(_run(engine, GenerationRequest("c", c, GREEDY, 12),
                                  GenerationRequest("a2", a, GREEDY, 12)))
        snapshot = engine.snapshot()
        engine.stop()
        held = memory.prefix.held_pages()
        in_use = memory.allocator.used
        memory.prefix.clear()
    finally:
        engine.stop()
    assert broken.raised == 1 and "a" in broken.carried
    for rid, events in zip("ab", failed):  # the step's requests failed, any other finished
        last = events[-1]
        if rid in broken.carried:
            assert last.finish == "error" and last.error.status == 500, last
            assert "RuntimeError: a kernel broke" in last.error.message
        else:
            assert last.finish == "length" and _tokens(events) == hf_greedy(dense.hf, list(b), 20)
    assert state_after_failure is EngineState.READY
    assert [e[-1].finish for e in served] == ["length", "length"]
    assert _tokens(served[0]) == hf_greedy(dense.hf, list(c), 12)
    assert _tokens(served[1]) == hf_greedy(dense.hf, list(a), 12)
    if where == "decode":  # `a`'s whole prompt came back from the tree
        assert served[1][-1].usage.cached_tokens > 0
    counters = snapshot.counters
    assert (counters.requests_failed, counters.requests_done) == (
        len(broken.carried), 4 - len(broken.carried))
    assert counters.steps_failed == 1
    assert in_use == len(held)  # only the prefix tree holds pages
    assert memory.allocator.free == pages and memory.free_state_slots == slots


def test_a_fault_that_outlives_its_rows_fails_the_engine(dense):
    """Every step raises: the first ends its request only, the next (no step between went
    well) fails the engine, and the request it carried ends with the engine's 503."""
    engine = _engine(dense)
    Broken(engine, lambda batch: True, RuntimeError("the pool is gone"))
    try:
        first = _one(engine, "e", seeded_prompt(20, 4), 8)
        state_between = engine.state
        second = _one(engine, "f", seeded_prompt(20, 5), 8)
    finally:
        engine.stop()
    assert (first[-1].finish, first[-1].error.status) == ("error", 500)
    assert state_between is EngineState.READY
    assert (second[-1].finish, second[-1].error.status) == ("error", 503)
    assert "the pool is gone" in second[-1].error.message
    assert engine.state is EngineState.FAILED


@pytest.mark.parametrize("error", [
    torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")])
def test_a_device_error_fails_the_engine_at_once(dense, error):
    engine = _engine(dense)
    Broken(engine, lambda batch: True, error)
    try:
        events = _one(engine, "g", seeded_prompt(20, 6), 8)
    finally:
        engine.stop()
    assert (events[-1].finish, events[-1].error.status) == ("error", 503)
    assert engine.state is EngineState.FAILED


DEFAULT_MODEL = default_artifact()


@pytest.mark.model
@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason=f"not prepared: {DEFAULT_MODEL}")
@pytest.mark.skipif(cpu_decode_unavailable() is not None, reason=f"{cpu_decode_unavailable()}")
def test_a_lookahead_step_that_raises_ends_its_rows():
    """The default model with the lookahead step forced on: a step launched on the one before's
    picks (`forward_from`) raises with two rows in flight; they end with an error, and the same
    two prompts then give the tokens a fresh engine gives them."""
    def engine_of():
        engine = Engine(EngineConfig(artifact=DEFAULT_MODEL, max_context=1024,
                                     max_concurrency=2, lookahead=True),
                        open_artifact(DEFAULT_MODEL))
        engine.start()
        return engine

    def requests(engine, tag):
        prompts = [tuple(engine.tokenizer.encode(engine.chat_template.render(
            [{"role": "user", "content": q}]))) for q in ("Name three colours.", "Say hi.")]
        return [GenerationRequest(f"{tag}{i}", p, GREEDY, 16) for i, p in enumerate(prompts)]

    fresh = engine_of()
    try:
        expected = [_tokens(e) for e in asyncio.run(_run(fresh, *requests(fresh, "x")))]
    finally:
        fresh.stop()
    engine = engine_of()
    broken = Broken(engine, lambda batch: len(batch.decode) == 2 and not broken.raised,
                    RuntimeError("a lookahead step broke"), method="forward_from")
    try:
        failed = asyncio.run(_run(engine, *requests(engine, "a")))
        again = asyncio.run(_run(engine, *requests(engine, "b")))
        state = engine.state
    finally:
        engine.stop()
    assert broken.raised == 1 and broken.carried == {"a0", "a1"}
    assert [(e[-1].finish, e[-1].error.status) for e in failed] == [("error", 500)] * 2
    assert state is EngineState.READY
    assert [_tokens(e) for e in again] == expected


def test_out_of_memory_ends_the_rows_not_the_engine():
    """A step that ran out of device memory leaves the pool intact: only its rows end."""
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    row = object()
    assert engine_wide(oom, [row], failed_before=False, lockstep=False) is None
    assert engine_wide(oom, [row], failed_before=True, lockstep=False) is not None


# a fault while admitting: (raised, status, code); out of memory is the pool's, 503
ADMISSION_FAULTS = {
    "type-error": (TypeError("a slot broke"), 500, "internal_error"),
    "runtime-error": (RuntimeError("a slot broke"), 500, "internal_error"),
    "out-of-memory": (torch.OutOfMemoryError("no room for a slot"), 503, "kv_exhausted")}


@pytest.mark.parametrize("fault", ADMISSION_FAULTS)
def test_a_fault_while_admitting_ends_that_request_and_gives_its_lease_back(dense, fault):
    """Admission raises after the request leased its pages (its state slot's acquisition
    fails): that request ends (503 `kv_exhausted` only when the device ran out of memory, 500
    otherwise), its pages go back, and the next one is served."""
    error, status, code = ADMISSION_FAULTS[fault]
    engine = _engine(dense)
    memory = engine.memory
    pages = memory.allocator.free
    acquire = memory.running_slots.acquire

    def broken_acquire(*args, **kwargs):
        memory.running_slots.acquire = acquire  # once
        raise error
    memory.running_slots.acquire = broken_acquire
    try:
        failed = _one(engine, "h", seeded_prompt(30, 7), 4)
        free_after = memory.allocator.free
        served = _one(engine, "i", seeded_prompt(30, 8), 4)
        state = engine.state
    finally:
        engine.stop()
    assert failed[-1].finish == "error"
    assert (failed[-1].error.status, failed[-1].error.code) == (status, code)
    assert str(error) in failed[-1].error.message
    assert free_after == pages
    assert state is EngineState.READY and served[-1].finish == "length"
    assert _tokens(served) == hf_greedy(dense.hf, list(seeded_prompt(30, 8)), 4)
