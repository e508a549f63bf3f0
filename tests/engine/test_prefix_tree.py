"""The prefix tree through the engine, for a tiny llama and a tiny hybrid model: greedy outputs
equal an engine without reuse for (a) an identical prompt, (b) a system prompt shared across
conversations, (c) a shared prefix ending mid-page, (d) an edited earlier turn and (e) eviction
under pressure; each hit reports exactly what it restored (64-token pages, 64-token chunks:
the hybrid model is snapshotted at every 64 tokens of a prompt, one token before its end and
at its answer's end)."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import FakeArtifact, tiny_llama

GREEDY = SamplingParams(temperature=0.0)


def _tokens(n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 128, (n,), generator=gen).tolist())


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def family(request):
    if request.param == "hybrid":
        pytest.importorskip("transformers.models.qwen3_5_moe")
        from .hybrid_helpers import HybridArtifact

        return "hybrid", HybridArtifact("qwen3_5")
    return "llama", FakeArtifact(tiny_llama(seed=7, vocab_size=259))


def _engine(artifact, **overrides) -> Engine:
    fields = {"prefill_chunk": 64, "max_context": 1024, "cuda_dtype": "fp32",
              "device_state_slots": 8, **overrides}
    engine = Engine(EngineConfig(artifact=Path("tiny.ninfer"), **fields), artifact)
    engine.start()
    return engine


def _run(engine, prompts, max_tokens=6, anchors=()):
    """Each prompt in turn (with `anchors[i]`, if given): (output tokens, cached tokens,
    computed prompt tokens, the output tokens' log-probabilities, the reuse path)."""
    async def one(i, prompt, sink):
        request = GenerationRequest(f"r{i}", prompt, GREEDY, max_tokens, ignore_eos=True,
                                    logprobs=0, logprob_sink=sink,
                                    anchors=anchors[i] if anchors else ())
        return [e async for e in engine.submit(request)]

    results = []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            sink: list = []
            events = asyncio.run(one(i, prompt, sink))
            final = events[-1]
            assert final.finish == "length", final.error
            results.append(([t for e in events for t in e.token_ids], final.usage.cached_tokens,
                            final.timings.prompt_n, [entry.logprob for entry in sink],
                            final.timings.reuse_path))
    return results


def _same_answers(got, want) -> None:
    """The same greedy tokens, and log-probabilities within fp32 rounding: a restored K/V row
    or state that differs from the computed one moves them by far more."""
    assert [g[0] for g in got] == [w[0] for w in want]
    gaps = [abs(a - b) for g, w in zip(got, want) for a, b in zip(g[3], w[3])]
    assert max(gaps) < 1e-4


def test_shared_prefixes_hit_and_answer_like_no_reuse(family):
    name, artifact = family
    system, mid = _tokens(150, 1), _tokens(100, 2)
    first = system + _tokens(20, 3)
    edited = list(first)
    edited[90] = (edited[90] + 1) % 128
    prompts = [
        first, first,  # (a) the same prompt again
        system + _tokens(25, 4),  # (b) another conversation, the same system prompt
        mid + _tokens(10, 5), mid + _tokens(12, 6),  # (c) a shared prefix ending mid-page
        tuple(edited) + _tokens(5, 7),  # (d) an earlier turn edited at token 90
    ]
    cached = _engine(artifact, device_state_slots=16)  # no snapshot evicted here: see below
    plain = _engine(artifact, no_prefix_reuse=True)
    try:
        got, want = _run(cached, prompts), _run(plain, prompts)
        stats = cached.snapshot().prefix
    finally:
        cached.stop()
        plain.stop()
    _same_answers(got, want)
    assert all(w[1] == 0 for w in want)
    if name == "llama":  # any token boundary: every shared token
        expected = [0, 169, 150, 0, 100, 90]
    else:  # the deepest snapshot: 64-token chunk ends, prompts' last token but one, answers
        expected = [0, 169, 128, 0, 64, 64]
    assert [g[1] for g in got] == expected
    assert [g[2] for g in got] == [len(p) - n for p, n in zip(prompts, expected)]
    assert (stats.lookups, stats.hits, stats.hit_tokens) == (6, 4, sum(expected))
    assert stats.pages > 0 and (stats.snapshots > 0) == (name == "hybrid")


def test_eviction_under_pressure_answers_like_no_reuse(family):
    name, artifact = family
    # 6 pages: two 130-token conversations do not both fit; the least recently used pages go
    a, b = _tokens(130, 11), _tokens(130, 12)
    prompts = [a, b, a + _tokens(8, 13), b + _tokens(8, 14)]
    cached = _engine(artifact, kv_capacity=384, kv_lease_window=8)
    plain = _engine(artifact, kv_capacity=384, kv_lease_window=8, no_prefix_reuse=True)
    try:
        got, want = _run(cached, prompts), _run(plain, prompts)
        stats = cached.snapshot().prefix
        allocator = cached.memory.allocator
        idle = allocator.used == cached.memory.prefix.pages  # only the tree holds pages
    finally:
        cached.stop()
        plain.stop()
    _same_answers(got, want)
    assert stats.evicted_pages > 0 and idle
    assert got[3][1] > 0  # the most recent conversation stayed and was continued


def test_evicted_pages_return_from_the_host_tier(family):
    """Three 130-token conversations through a 6-page pool: the third pushes the first two
    out, so without a host tier their next turns restore nothing; with one (`--host-kv-mib 1`,
    `--host-state-slots 2`) their pages went to host memory and come back: both next turns
    reuse their whole first prompt (hybrid: from the snapshot one token before its end),
    answering as an engine without reuse does."""
    name, artifact = family
    a, b = _tokens(130, 11), _tokens(130, 12)
    prompts = [a, b, _tokens(130, 15), a + _tokens(8, 13), b + _tokens(8, 14)]
    pressure = {"kv_capacity": 384, "kv_lease_window": 8}
    device = _engine(artifact, **pressure)
    tiered = _engine(artifact, host_kv_mib=1, host_state_slots=2, **pressure)
    plain = _engine(artifact, no_prefix_reuse=True, **pressure)
    try:
        alone, got, want = _run(device, prompts), _run(tiered, prompts), _run(plain, prompts)
        stats = tiered.snapshot().prefix
    finally:
        for engine in (device, tiered, plain):
            engine.stop()
    _same_answers(got, want)
    assert [r[1] for r in alone[3:]] == [0, 0]
    full = 129 if name == "hybrid" else 130
    assert [r[1] for r in got[3:]] == [full, full]
    assert stats.host_restored_pages >= 4 and stats.host_pages > 0


def test_a_restore_pushes_out_the_pages_it_needs_in_one_batched_copy(family, monkeypatch):
    """A 6-page pool and two 250-token conversations: b pushes a's last pages to the host tier,
    then a's next turn restores them, which pushes as many of b's out. Those demotions are one
    batched copy to the host, not one copy a page (a 32K prefix restored on the H200 made
    ~2,000 small copies), and the turn answers as an engine without reuse does."""
    from ninfer_engine.kv.host_tier import HostTier
    from ninfer_engine.kv.radix_host import HostMoves

    restoring, batches = [], []
    copy_out, restore = HostTier.copy_out, HostMoves._restore

    def counted_copy(tier, pages, hosts):
        if restoring:
            batches.append(len(pages))
        copy_out(tier, pages, hosts)

    def marked_restore(tree, plan):
        restoring.append(True)
        try:
            return restore(tree, plan)
        finally:
            restoring.pop()
    monkeypatch.setattr(HostTier, "copy_out", counted_copy)
    monkeypatch.setattr(HostMoves, "_restore", marked_restore)
    name, artifact = family
    a, b = _tokens(250, 21), _tokens(250, 22)
    prompts = [a, b, a + _tokens(8, 23)]
    pressure = {"kv_capacity": 384, "kv_lease_window": 8}
    tiered = _engine(artifact, host_kv_mib=1, host_state_slots=4, **pressure)
    plain = _engine(artifact, no_prefix_reuse=True, **pressure)
    try:
        got, want = _run(tiered, prompts), _run(plain, prompts)
    finally:
        for engine in (tiered, plain):
            engine.stop()
    _same_answers(got, want)
    assert got[2][1] == (249 if name == "hybrid" else 250)
    assert len(batches) == 1 and batches[0] >= 2, batches  # [1, 1] page by page


def test_an_anchor_is_a_restore_point_named_by_its_reuse_path(family):
    """Two prompts sharing 100 tokens, the first anchored there (a message boundary): the
    hybrid family restores all 100 from the anchor's snapshot (without it, the 64 of its last
    chunk snapshot), the llama family any page boundary anyway; each hit names its reuse path,
    and the answers are those of an engine without reuse."""
    name, artifact = family
    shared = _tokens(100, 21)
    prompts = [shared + _tokens(30, 22), shared + _tokens(30, 23)]
    anchored = _engine(artifact)
    bare = _engine(artifact)
    plain = _engine(artifact, no_prefix_reuse=True)
    try:
        got = _run(anchored, prompts, anchors=[((100, "private_turn_closure"),), ()])
        without, want = _run(bare, prompts), _run(plain, prompts)
    finally:
        for engine in (anchored, bare, plain):
            engine.stop()
    _same_answers(got, want)
    assert got[0][4] == "root"
    if name == "hybrid":
        assert (got[1][1], got[1][4]) == (100, "private_turn_closure")
        assert (without[1][1], without[1][4]) == (64, "private_long_anchor")
    else:  # token-granular: the first prompt's pages and the copied part of its second page
        assert (got[1][1], got[1][4]) == (100, "shared_stable_prefix")


@pytest.mark.slow
def test_concurrent_random_conversations_answer_like_no_reuse(family):
    """48 requests, three at a time, from shared system prompts, repeats, next turns and edits,
    in a pool small enough to evict: each greedy answer equals the no-reuse engine's, and once
    every request is done only the tree holds pages."""
    name, artifact = family
    rng = random.Random(3)
    systems = [_tokens(rng.randint(40, 140), 30 + i) for i in range(3)]
    prompts: list[tuple[int, ...]] = []
    for i in range(48):
        kind = rng.random() if prompts else 0.0
        if kind < 0.4:
            prompt = rng.choice(systems) + _tokens(rng.randint(1, 40), 100 + i)
        elif kind < 0.6:
            prompt = rng.choice(prompts)
        elif kind < 0.85:
            prompt = rng.choice(prompts) + _tokens(rng.randint(1, 30), 200 + i)
        else:
            edited = list(rng.choice(prompts))
            edited[rng.randrange(len(edited))] = rng.randrange(128)
            prompt = tuple(edited)
        prompts.append(prompt[-300:])
    options = {"max_concurrency": 3, "kv_capacity": 1280, "kv_lease_window": 8}

    def run(engine):
        async def one(i, prompt):
            sink: list = []
            request = GenerationRequest(f"r{i}", prompt, GREEDY, 5, ignore_eos=True,
                                        logprobs=0, logprob_sink=sink)
            await asyncio.sleep(0.002 * i)  # arrivals interleave with running requests
            events = [e async for e in engine.submit(request)]
            return ([t for e in events for t in e.token_ids], events[-1].usage.cached_tokens,
                    None, [entry.logprob for entry in sink])

        async def every():
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

        with torch.inference_mode():
            return asyncio.run(every())

    cached = _engine(artifact, **options)
    plain = _engine(artifact, no_prefix_reuse=True, **options)
    try:
        got, want = run(cached), run(plain)
        cached.stop()
        memory = cached.memory
        idle = memory.allocator.used == len(memory.prefix.held_pages())
    finally:
        cached.stop()
        plain.stop()
    _same_answers(got, want)
    assert sum(g[1] for g in got) > 1000 and idle


def test_the_same_prompt_hits_under_default_slots(family):
    """Without --device-state-slots a hybrid engine keeps a prompt-end and an answer-end
    snapshot (with one slot per request the answer's replaced the prompt's, and the same
    prompt again restored nothing)."""
    name, artifact = family
    prompt = _tokens(100, 21)
    engine = _engine(artifact, device_state_slots=None)
    try:
        got = _run(engine, [prompt, prompt])
    finally:
        engine.stop()
    assert [g[1] for g in got] == [0, 99]  # everything but the last token, which samples


def test_idle_tree_pages_count_as_cached_not_used(family):
    """After a request ends its pages stay in the tree for reuse: the KV figures say cached
    (evictable), not used, as /metrics' kv_cache_usage_perc and the console read them."""
    _, artifact = family
    engine = _engine(artifact)
    try:
        _run(engine, [_tokens(150, 31)])
    finally:
        engine.stop()  # publishes a last snapshot (a busy engine publishes every 50 ms)
    kv = engine.snapshot().kv
    assert kv.used == 0 and kv.cached >= 150 // kv.page_tokens
    assert kv.used + kv.cached + kv.free + kv.lent == kv.total
