"""`--spec ngram`: prompt-lookup drafts verified in the step, greedy output exactly that of
plain decoding (llama and hybrid families, CPU eager verify rows), with acceptance counted."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.step.sampling import Sampler, sample_rows
from ninfer_engine.step.speculation import NgramDrafter, Speculator, accept_greedy
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import FakeArtifact, tiny_llama
from .hybrid_helpers import HybridArtifact


def test_ngram_drafts_continue_the_latest_earlier_occurrence():
    drafter = NgramDrafter()
    tokens = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 4, 5, 6, 7]
    # the 3-gram 5 6 7 last occurred at 7..9, followed by 3 4 (and the tail itself)
    assert drafter.propose(tokens, 3) == [3, 4, 5]
    assert drafter.propose(tokens, 1) == [3]
    assert drafter.propose([1, 2, 3, 4], 3) == []  # nothing repeats
    # a continuation that reaches the end goes on from the drafts: 9 1 2 then 9 1 2 again
    assert drafter.propose([1, 2, 9, 1, 2], 5) == [9, 1, 2, 9, 1]
    assert drafter.propose([4, 4, 4], 3) == [4, 4, 4]


def test_greedy_acceptance_with_penalties_is_plain_greedy_token_by_token():
    """Position i's choice counts drafts 1..i for the penalties, as sequential decoding would."""
    gen = torch.Generator().manual_seed(4)
    params = SamplingParams(temperature=0.0, frequency_penalty=0.7, presence_penalty=0.4)
    for trial in range(20):
        logits = torch.randn(4, 12, generator=gen)
        history = torch.randint(0, 12, (5,), generator=gen).tolist()
        # drafts = what plain greedy would pick, with one changed at a trial-dependent spot
        plain = Sampler(params)
        for t in history:
            plain.record(t)
        spec = Sampler(params)
        for t in history:
            spec.record(t)
        want = [sample_rows(logits[i: i + 1], [plain])[0] for i in range(4)]
        drafts = list(want[:3])
        wrong = trial % 4
        if wrong < 3:
            drafts[wrong] = (drafts[wrong] + 1) % 12
        emitted = accept_greedy([(spec, drafts, logits)])[0]
        cut = wrong if wrong < 3 else 3
        assert emitted == want[: cut + 1]


def _run(engine, prompts, max_tokens):
    async def one(i, prompt):
        request = GenerationRequest(f"r{i}", prompt, SamplingParams(temperature=0.0),
                                    max_tokens, ignore_eos=True)
        return [t for e in [e async for e in engine.submit(request)] for t in e.token_ids]

    async def all_():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return asyncio.run(all_())


def _prompts(vocab):
    # prompts that repeat themselves, so prompt lookup has something to propose; two rows at
    # once, so verify rows share steps with each other and with plain decode rows
    gen = torch.Generator().manual_seed(9)
    base = torch.randint(3, vocab, (12,), generator=gen).tolist()
    return [tuple(base * 3), tuple(base[:7] * 4 + [2])]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_greedy_output_is_the_same_with_and_without_ngram_drafts(family):
    artifact = (FakeArtifact(tiny_llama(seed=5, vocab_size=259)) if family == "llama"
                else HybridArtifact("qwen3_5"))
    outputs, engines = [], []
    for spec in (None, "ngram"):
        engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=512,
                                     prefill_chunk=64, cuda_dtype="fp32", spec=spec,
                                     draft_tokens=3 if spec else None), artifact)
        engine.start()
        try:
            outputs.append(_run(engine, _prompts(120), 40))
        finally:
            engine.stop()
        engines.append(engine)
    assert outputs[0] == outputs[1]
    counters = engines[1].speculator.counters
    # the tiny random models repeat their context: drafts are proposed, most accepted, some not
    assert counters.rounds > 0 and counters.drafted > 0
    assert 0 < counters.accepted < counters.drafted
    assert sum(counters.per_position) == counters.accepted
    assert engines[0].speculator is None


def test_speculator_backs_off_a_request_whose_drafts_are_rejected():
    spec = Speculator("ngram", 3)

    class Seq:
        prompt, output = (1, 2, 3, 1, 2), [3]
        thinking_cap = None
        sampler = Sampler(SamplingParams(temperature=0.0))
    seq = Seq()
    assert spec.drafts(seq, 3) == [1, 2, 3]
    for _ in range(6):
        spec.record(seq, 3, 0)
    assert spec.drafts(seq, 3) == []  # paused
    assert spec.counters.fallback == 1
    sampled = Seq()
    sampled.sampler = Sampler(SamplingParams(temperature=0.7))
    assert spec.drafts(sampled, 3) == []  # only greedy rows draft (rejection sampling: not yet)
    with pytest.raises(ValueError, match="mtp is not available yet"):
        Speculator("mtp", 3)


def test_acceptance_reaches_the_engine_snapshot():
    artifact = FakeArtifact(tiny_llama(seed=5, vocab_size=259))
    engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=512, prefill_chunk=64,
                                 spec="ngram", draft_tokens=3), artifact)
    engine.start()
    try:
        _run(engine, _prompts(120)[:1], 30)
    finally:
        engine.stop()
    spec, c = engine.snapshot().spec, engine.speculator.counters
    assert spec.backend == "ngram" and spec.window == 3
    assert (spec.rounds, spec.drafted, spec.accepted) == (c.rounds, c.drafted, c.accepted) != (0, 0, 0)
    assert spec.per_position == tuple(n / c.rounds for n in c.per_position)
    assert 1.0 < spec.tokens_per_round <= 4.0
