"""`--spec dflash` with prefix reuse: the drafter's conditioning rows live with the KV pages
(`step.dflash_drafter`), so a restored prefix rebuilds the drafter's context.

Greedy output with dflash and reuse equals dflash without reuse and plain decoding for the same
prompt twice, a shared system prompt and a conversation's second turn, also when the pages went
through the host tier; the context a restore builds has exactly the rows the first request
computed, and its keys and values are those of a fresh build from them (to the rounding of
their projection); nothing leaks."""
from __future__ import annotations

import asyncio

import pytest
import torch

from ninfer_engine.models.dflash import DFlashContext
from ninfer_engine.types import GenerationRequest, SamplingParams

from tests.tolerance import TRANSCENDENTAL, bound
from .dflash_helpers import DFlashArtifact
from .test_speculation import _engine as engine_with

TOKENS = 12
SETTINGS = dict(max_concurrency=2, prefill_chunk=16, draft_tokens=5)


def _tokens(n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(3, 120, (n,), generator=gen).tolist())


def _serve(engine, prompts, logprobs=()) -> list[tuple[list[int], int]]:
    """Each prompt in turn (a callable: of the outputs so far): (output tokens, cached); the
    requests at `logprobs` ask for log-probabilities (so they never draft)."""
    async def one(i, prompt):
        extra = dict(logprobs=0, logprob_sink=[]) if i in logprobs else {}
        request = GenerationRequest(f"r{i}", prompt, SamplingParams(temperature=0.0), TOKENS,
                                    ignore_eos=True, **extra)
        events = [e async for e in engine.submit(request)]
        return [t for e in events for t in e.token_ids], events[-1].usage.cached_tokens

    out = []
    for i, prompt in enumerate(prompts):
        out.append(asyncio.run(one(i, prompt(out) if callable(prompt) else prompt)))
    return out


class _Recorder:
    """What the engine's DFlash drafter computed: each request's conditioning rows in the
    chunks it computed them (`_store`), and each restored context with the rows it read."""

    def __init__(self, drafter) -> None:
        self.drafter, self.conds, self.restored = drafter, {}, []
        store, restore = drafter._store, drafter.model.restore

        def recording_store(work):
            conds = store(work)
            for (row, _), cond in zip(work, conds):
                self.conds.setdefault(row.seq.id, []).append(cond.clone())
            return conds

        def recording_restore(cond):
            ctx = restore(cond)  # (as built: the request goes on extending it)
            held = [(kv.k[:, : kv.length].clone(), kv.v[:, : kv.length].clone())
                    for kv in ctx.kv]
            self.restored.append((cond.clone(), ctx.end, list(ctx.first), held))
            return ctx

        drafter._store, drafter.model.restore = recording_store, recording_restore


def _prompts(case: str, seed: int):
    if case == "same prompt":
        p = _tokens(70, seed)
        return [p, p]
    if case == "shared system prompt":
        system = _tokens(80, seed)
        return [system + _tokens(20, seed + 1), system + _tokens(25, seed + 2)]
    first = _tokens(50, seed)  # the second turn: the first, its answer, a new message
    return [first, lambda out: first + tuple(out[0][0]) + _tokens(15, seed + 1)]


def _check_restored(recorder: _Recorder, first: str, reused: int, model) -> None:
    """The one restore read `reused` rows, exactly those request `first` computed, and its
    context's keys and values are those of a fresh build from them in that request's chunks."""
    assert len(recorder.restored) == 1
    cond, end, firsts, held = recorder.restored[0]
    chunks = recorder.conds[first]
    assert end == reused and torch.equal(cond, torch.cat(chunks)[:reused])
    fresh, at = DFlashContext(model, 0), 0
    for chunk in chunks:  # as the first request's context grew
        take = chunk[: max(reused - at, 0)]
        if len(take):
            model.extend_rows([fresh], [take])
        at += len(chunk)
    c = model.config
    # k: the projection's length-H dot, k_norm's length-D sum of squares, its rsqrt, scale,
    # weight and cast, RoPE's two products and sum; v: the projection alone
    depth = c.hidden + c.head_dim + TRANSCENDENTAL + 6
    for n, window in enumerate(c.windows):
        (k, v), want = held[n], fresh.kv[n]
        assert firsts[n] == (0 if window is None else max(reused - window, 0))
        lo = firsts[n] - fresh.first[n]  # the fresh sliding layer may hold older positions
        assert lo >= 0 and fresh.first[n] + want.length == reused == firsts[n] + k.shape[1]
        for got, ref in ((k, want.k), (v, want.v)):
            ref = ref[:, lo: want.length]
            limit = bound(model.dtype, depth) * ref.abs().max()
            assert (got - ref).abs().max() <= limit, (n, window)


def _no_leaks(engine, pages: int, slots: int) -> None:
    memory = engine.memory
    assert memory.allocator.used == len(memory.prefix.held_pages())  # only the tree holds pages
    memory.prefix.clear()
    assert memory.allocator.free == pages and memory.free_state_slots == slots
    assert memory.allocator.owners() == 0 and not engine.speculator.drafter._rows


@pytest.mark.parametrize("case", ["same prompt", "shared system prompt", "second turn"])
def test_greedy_output_with_reuse_is_that_without_and_the_restored_context_a_fresh_one(case):
    artifact, prompts = DFlashArtifact("qwen3_5"), _prompts(case, seed=31)
    plain = engine_with(artifact, None, no_prefix_reuse=True, **SETTINGS)
    alone = engine_with(artifact, "dflash", no_prefix_reuse=True, **SETTINGS)
    reuse = engine_with(artifact, "dflash", **SETTINGS)
    recorder = _Recorder(reuse.speculator.drafter)
    pages, slots = reuse.memory.allocator.free, reuse.memory.free_state_slots
    try:
        want, without, got = _serve(plain, prompts), _serve(alone, prompts), _serve(reuse, prompts)
        for engine in (plain, alone, reuse):
            engine.stop()
        _no_leaks(reuse, pages, slots)
    finally:
        for engine in (plain, alone, reuse):
            engine.stop()
    assert [t for t, _ in got] == [t for t, _ in without] == [t for t, _ in want]
    assert [c for _, c in without] == [0, 0]
    reused = got[1][1]
    expected = {"same prompt": 69,  # all but the prompt's last token: its logits are needed
                "shared system prompt": 64,  # the chunk snapshot inside the shared 80
                "second turn": 50 + TOKENS - 1}[case]  # the answer, but its unread last token
    assert got[0][1] == 0 and reused == expected
    counters = reuse.speculator.counters
    assert counters.rounds > 0 and counters.accepted < counters.drafted
    _check_restored(recorder, "r0", reused, reuse.speculator.drafter.model)


def serve_through_the_host_tier(artifact, spec: str, recorder_class, settings=SETTINGS):
    """Three 130-token prompts through a 6-page pool push the first one's pages to the host
    tier; its second turn restores them. Returns the plain run's (tokens, cached) per request,
    `spec`'s with reuse, its prefix stats, its engine (stopped) and its drafter's recorder."""
    a = _tokens(130, 41)
    prompts = [a, _tokens(130, 42), _tokens(130, 43), a + _tokens(8, 44)]
    # (8 snapshot slots: with 4, the later prompts' snapshots push out the first's, as they
    # do without a drafter)
    pressure = dict(kv_capacity=384, kv_lease_window=8, device_state_slots=8, **settings)
    plain = engine_with(artifact, None, no_prefix_reuse=True, **pressure)
    tiered = engine_with(artifact, spec, host_kv_mib=1, host_state_slots=2, **pressure)
    recorder = recorder_class(tiered.speculator.drafter)
    try:
        want, got = _serve(plain, prompts), _serve(tiered, prompts)
        stats = tiered.snapshot().prefix
    finally:
        plain.stop()
        tiered.stop()
    return want, got, stats, tiered, recorder


def test_pages_back_from_the_host_tier_bring_the_drafter_rows():
    """The host tier carries the drafter's rows with the pages (`kv.host_tier`)."""
    want, got, stats, tiered, recorder = serve_through_the_host_tier(
        DFlashArtifact("qwen3_5"), "dflash", _Recorder)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [c for _, c in got] == [0, 0, 0, 129] and stats.host_restored_pages >= 2
    _check_restored(recorder, "r0", 129, tiered.speculator.drafter.model)


def test_a_request_that_never_drafts_still_leaves_its_rows_for_the_next():
    """The first request asks for log-probabilities, so it never drafts; its pages join the
    prefix tree all the same, and the same prompt again restores the drafter rows it left."""
    artifact, prompts = DFlashArtifact("qwen3_5"), _prompts("same prompt", seed=51)
    plain = engine_with(artifact, None, no_prefix_reuse=True, **SETTINGS)
    reuse = engine_with(artifact, "dflash", **SETTINGS)
    recorder = _Recorder(reuse.speculator.drafter)
    try:
        want, got = _serve(plain, prompts), _serve(reuse, prompts, logprobs=(0,))
    finally:
        plain.stop()
        reuse.stop()
    assert [t for t, _ in got] == [t for t, _ in want] and got[1][1] == 69
    assert reuse.speculator.counters.rounds > 0  # the second request drafted
    _check_restored(recorder, "r0", 69, reuse.speculator.drafter.model)
