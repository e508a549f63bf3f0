"""`--spec ngram`: prompt-lookup drafts verified in the step, greedy output exactly that of
plain decoding (llama and hybrid families, CPU eager verify rows), with acceptance counted."""
from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.step import speculation
from ninfer_engine.step.sampling import Sampler, sample_rows
from ninfer_engine.step.spec_overlap import prompt_ngram_overlap
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from ninfer_engine.step.acceptance import accept_greedy, accept_sampled
from ninfer_engine.step.speculation import MAX_NGRAM, MIN_NGRAM, NgramDrafter, Speculator
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


def _latest_occurrence_drafts(tokens, k):
    """`NgramDrafter.propose` by its definition, scanned token by token."""
    for n in range(min(MAX_NGRAM, len(tokens) - 1), MIN_NGRAM - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start: start + n] == tokens[len(tokens) - n:]:
                drafts = []
                while len(drafts) < k:
                    at = start + n + len(drafts)
                    drafts.append(tokens[at] if at < len(tokens) else drafts[at - len(tokens)])
                return drafts
    return []


def test_ngram_drafts_match_their_definition_on_random_and_byte_aligned_tokens():
    """The byte search finds what a token-by-token scan does: random short alphabets (many
    repeats), and ids whose bytes match across token boundaries (256 = 0x100, 1 = 0x01)."""
    gen = torch.Generator().manual_seed(3)
    drafter = NgramDrafter()
    cases = [torch.randint(0, v, (n,), generator=gen).tolist()
             for v in (2, 3, 5, 50) for n in (1, 2, 3, 5, 9, 40, 200)]
    cases += [[1, 256, 1, 0, 0, 1, 256, 1], [256, 0, 0, 5, 1, 0], [7, 1, 0, 256, 0, 0, 1, 0],
              [2**40, 1, 2**40, 1]]
    for tokens in cases:
        for k in (1, 3, 6):
            assert drafter.propose(tokens, k) == _latest_occurrence_drafts(tokens, k), tokens


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


def _engine(artifact, spec: str | None = "ngram", **config) -> Engine:
    settings = dict(artifact=Path("t.ninfer"), max_context=512, prefill_chunk=64,
                    cuda_dtype="fp32", spec=spec, draft_tokens=3 if spec else None)
    engine = Engine(EngineConfig(**{**settings, **config}), artifact)
    if engine.speculator is not None:  # drafts by the rules under test, not by step timings
        engine.speculator.policy = AlwaysSpeculate()
    engine.start()
    return engine


def off_and_ngram(artifact, **config):
    """The same greedy prompts through an engine without speculation, then one with `--spec
    ngram`: (their outputs, the stopped engines)."""
    outputs, engines = [], []
    for spec in (None, "ngram"):
        engine = _engine(artifact, spec, **config)
        try:
            outputs.append(_run(engine, _prompts(120), 40))
        finally:
            engine.stop()
        engines.append(engine)
    return outputs, engines


def _run(engine, prompts, max_tokens, sampling=SamplingParams(temperature=0.0)):
    async def one(i, prompt):
        request = GenerationRequest(f"r{i}", prompt, sampling, max_tokens, ignore_eos=True)
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


def test_a_round_goes_ahead_only_where_no_outcome_of_the_one_in_flight_pauses_its_row():
    """`goes_on` (a verify chain's next round launched before this one is read) holds exactly
    while a round accepting nothing would leave the row drafting: the round it refuses is the
    one after which the row pauses, so an ahead round never verifies what the host path would
    have decoded plainly."""
    spec, seq = Speculator("ngram", 3), SimpleNamespace()
    spec.policy = AlwaysSpeculate()
    sure = []
    for _ in range(20):  # bounded: the average halves in about two rounds
        sure.append(spec.goes_on([seq]))
        spec.record(seq, 3, 0)
        if spec._rows[id(seq)].paused:
            break
    assert spec._rows[id(seq)].paused
    assert sure[-1] is False and all(sure[:-1]) and len(sure) > 2
    assert not spec.goes_on([seq])  # paused


def test_a_row_whose_lookups_find_nothing_looks_again_after_a_growing_pause():
    """`--spec ngram`: the n-th empty lookup in a row pauses the row 2^(n-1) steps (at most
    `MAX_EMPTY_PAUSE`), plain decode rows that go ahead (`plain_next` says so once every row
    is paused); a lookup that finds drafts ends the streak, and the row looks every step."""
    spec = Speculator("ngram", 3)
    spec.policy = AlwaysSpeculate()
    looked = []
    propose = spec.drafter.propose
    spec.drafter.propose = lambda tokens, k: looked.append(len(tokens)) or propose(tokens, k)
    seq = SimpleNamespace(prompt=list(range(10, 30)), output=[], thinking_cap=None,
                          draft_fallback=0,
                          sampler=SimpleNamespace(logprobs=None, constraint=None))
    asks, ahead = [], 0
    for step in range(40):  # new tokens every step: nothing repeats
        if spec.plain_next([seq]):
            ahead += 1
        else:
            asks.append(step) if spec.draft_rows([seq], [3]) == [[]] else None
        seq.output.append(100 + step)
    gaps = [b - a - 1 for a, b in zip(asks, asks[1:])]
    assert gaps == [1, 2, 4, 8, 8, 8], asks  # paused 1, 2, 4, then 8 steps after each
    assert ahead == 40 - len(asks) and len(looked) == len(asks)
    seq.output += seq.output[-6:]  # now the text repeats itself: drafts, and no pause
    while spec.plain_next([seq]):
        seq.output.append(seq.output[-6])
    assert spec.draft_rows([seq], [3]) != [[]]
    assert not spec.plain_next([seq])


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_greedy_output_is_the_same_with_and_without_ngram_drafts(family, monkeypatch):
    # every step looks up (no pause after an empty lookup), so that some drafts are rejected
    monkeypatch.setattr(speculation, "MAX_EMPTY_PAUSE", 0)
    artifact = (FakeArtifact(tiny_llama(seed=5, vocab_size=259)) if family == "llama"
                else HybridArtifact("qwen3_5"))
    outputs, engines = off_and_ngram(artifact)
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
        thinking_cap, draft_fallback = None, 0
        sampler = Sampler(SamplingParams(temperature=0.0))
    seq = Seq()
    assert spec.drafts(seq, 3) == [1, 2, 3]
    for _ in range(6):
        spec.record(seq, 3, 0)
    assert spec.drafts(seq, 3) == []  # paused
    assert spec.counters.fallback == seq.draft_fallback == 1
    constrained = Seq()
    constrained.sampler = Sampler(SamplingParams(temperature=0.7), logprobs=2, logprob_sink=[])
    assert spec.drafts(constrained, 3) == []  # a row asking for logprobs decodes plainly


def test_acceptance_reaches_the_engine_snapshot():
    engine = _engine(FakeArtifact(tiny_llama(seed=5, vocab_size=259)))
    try:
        _run(engine, _prompts(120)[:1], 30)
    finally:
        engine.stop()
    spec, c = engine.snapshot().spec, engine.speculator.counters
    assert spec.backend == "ngram" and spec.window == 3
    assert (spec.rounds, spec.drafted, spec.accepted) == (c.rounds, c.drafted, c.accepted) != (0, 0, 0)
    assert spec.per_position == tuple(n / c.rounds for n in c.per_position)
    assert 1.0 < spec.tokens_per_round <= 4.0


def test_a_requests_final_timings_carry_its_rounds_and_with_detail_its_prompt_overlap():
    engine = _engine(FakeArtifact(tiny_llama(seed=5, vocab_size=259)),
                     log_speculation_detail=True)
    prompt = _prompts(120)[0]

    async def run():
        request = GenerationRequest("r", prompt, SamplingParams(temperature=0.0), 30,
                                    ignore_eos=True)
        return [e async for e in engine.submit(request)]
    try:
        events = asyncio.run(run())
    finally:
        engine.stop()
    t, c = events[-1].timings, engine.speculator.counters
    output = [tok for e in events for tok in e.token_ids]
    # one request: its rounds are the engine's; each round emits its accepted drafts plus one
    assert len(t.draft_rounds) == c.rounds > 0 and sum(t.draft_rounds) == t.draft_accepted
    assert t.draft_accepted == c.accepted and t.draft_n == c.drafted
    assert [sum(1 for a in t.draft_rounds if a > i) for i in range(3)] == c.per_position
    assert t.draft_fallback == c.fallback
    assert t.prompt_ngram_overlap == prompt_ngram_overlap(prompt, output)  # unit-tested below
    assert all(e.timings is None or e.timings.draft_rounds == () for e in events[:-1])


def test_prompt_ngram_overlap_counts_output_tokens_that_end_a_prompt_trigram():
    prompt = (1, 2, 3, 4, 5)  # trigrams (1, 2, 3), (2, 3, 4), (3, 4, 5)
    assert prompt_ngram_overlap(prompt, []) == 0.0
    assert prompt_ngram_overlap(prompt, [4, 5, 9]) == 0.0  # (5, 4, 5), (4, 5, 9)... none
    assert prompt_ngram_overlap(prompt, [1, 2, 3, 4]) == 0.5  # (1, 2, 3) and (2, 3, 4)
    assert prompt_ngram_overlap((1, 2), [1, 2]) == 0.0  # a prompt without a trigram


# chi-square critical values at significance 0.001, by degrees of freedom
CHI2_0001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}


def _target(logits: torch.Tensor, params: SamplingParams, counts: dict[int, int]) -> torch.Tensor:
    """The request's sampling distribution over the vocabulary for one row of logits, from the
    sampler's own filters (penalties, temperature, top-k/p)."""
    from types import SimpleNamespace

    from ninfer_engine.step.sampling_paths import CANDIDATES, path_of
    from ninfer_engine.step.sampling_penalties import _penalized
    view = SimpleNamespace(params=params, counts=counts)
    probs, ids = CANDIDATES[path_of(params)](_penalized(logits[None], [view]), [view])
    probs = probs[0].double() / probs[0].sum()
    vocab = torch.zeros(logits.shape[-1], dtype=torch.float64)
    return probs if ids is None else vocab.index_add_(0, ids[0], probs)


def _chi_square_ok(counts: list[int], probs: torch.Tensor) -> bool:
    support = probs > 0
    observed = torch.tensor(counts, dtype=torch.float64)
    assert observed[~support].sum() == 0  # nothing outside the support, ever
    expected = probs[support] * observed.sum()
    statistic = float(((observed[support] - expected) ** 2 / expected).sum())
    return statistic < CHI2_0001[int(support.sum()) - 1]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_p=0.95, frequency_penalty=0.5),
    SamplingParams(temperature=1.0, top_k=4),
])
def test_rejection_sampling_keeps_the_target_distribution(params):
    """Many seeded verify rounds on a 6-token vocabulary: the first emitted token follows the
    request's distribution at position 0 whatever the draft, and the second (after the draft
    was taken) the distribution at position 1 with the draft counted."""
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(1)) * 1.5
    drafts, history = [2, 4], {1: 2, 5: 1}
    first, second = [0] * 6, [0] * 6
    for seed in range(4000):
        sampler = Sampler(dataclasses.replace(params, seed=seed))
        for token, n in history.items():
            for _ in range(n):
                sampler.record(token)
        tokens = accept_sampled([(sampler, drafts, logits)])[0]
        first[tokens[0]] += 1
        if tokens[0] == drafts[0]:
            second[tokens[1]] += 1
    assert _chi_square_ok(first, _target(logits[0], params, dict(history)))
    assert sum(second) > 100
    assert _chi_square_ok(second, _target(logits[1], params, {**history, drafts[0]: 1}))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=1.0, top_k=4),
])
def test_rejection_sampling_with_proposal_distributions_keeps_the_target_distribution(params):
    """Drafts drawn from their own distribution q over three candidates (a DFlash2 walk's),
    verified with it: the first emitted token follows the request's distribution at position
    0, and the second (after the first draft was taken) that at position 1; the first draft
    is taken as often as Σ min(p, q) says (point-mass verification would take it Σ q·p of the
    time), within 3.29 binomial deviations (two-sided 0.001, the chi-square tests' level)."""
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(3)) * 1.5
    candidates = [torch.tensor([2, 4, 0]), torch.tensor([1, 4, 5])]
    qs = [torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64),
          torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)]
    draws = torch.Generator().manual_seed(4)
    first, second, taken = [0] * 6, [0] * 6, 0
    for seed in range(4000):
        sampler = Sampler(dataclasses.replace(params, seed=seed))
        drafts = [int(c[torch.multinomial(q, 1, generator=draws)])
                  for c, q in zip(candidates, qs)]
        tokens = accept_sampled([(sampler, drafts, logits, list(zip(candidates, qs)))])[0]
        first[tokens[0]] += 1
        if tokens[0] == drafts[0] and len(tokens) > 1:
            taken += 1
            second[tokens[1]] += 1
    p = _target(logits[0], params, {})
    assert _chi_square_ok(first, p)
    assert sum(second) > 100
    assert _chi_square_ok(second, _target(logits[1], params, {}))
    q = torch.zeros(6, dtype=torch.float64).index_add_(0, candidates[0], qs[0])
    rate = float(torch.minimum(p, q).sum())
    assert abs(taken - 4000 * rate) <= 3.29 * (4000 * rate * (1 - rate)) ** 0.5


def test_rejection_sampling_is_reproducible_from_the_seed():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=123)
    runs = [accept_sampled([(Sampler(params), [3, 7, 9], logits)])[0] for _ in range(2)]
    assert runs[0] == runs[1]


def test_sampled_requests_verify_drafts_in_the_engine():
    engine = _engine(FakeArtifact(tiny_llama(seed=5, vocab_size=259)))
    try:
        [tokens] = _run(engine, _prompts(120)[:1], 30, SamplingParams(temperature=0.05, seed=7))
    finally:
        engine.stop()
    assert len(tokens) == 30
    assert engine.speculator.counters.rounds > 0


def test_a_model_free_drafter_leaves_the_runner_without_a_hidden_sink():
    """Hiddens go only to a drafter that reads them: with a sink the runner needs a graph step
    that keeps hiddens, so an n-gram engine with one ran every CUDA step eagerly (27B: 7 tok/s
    against 71 on the H200)."""
    engine = _engine(HybridArtifact("qwen3_5"))
    try:
        assert not engine.speculator.reads_hidden and engine.runner.hidden_sink is None
    finally:
        engine.stop()


def test_a_verify_steps_every_decode_row_leases_the_padding_of_one_plus_k_tokens():
    """The verify graph pads each decode row of a step with drafts to 1 + k tokens, writing K/V
    there: past a row's lease the page table names another sequence's page
    (`DecodeGraphs.pads`). So a step with drafts grows every decode row's lease through
    `cached + 1 + k` where it can (within the context), a row without drafts included; a
    step without drafts grows none."""
    from ninfer_engine.step.prepare import StepPrepare
    from ninfer_engine.step.scheduler import Batch

    def row(cached, capacity):
        return SimpleNamespace(cached=cached, output=[1], request=SimpleNamespace(max_tokens=100),
                               cache=SimpleNamespace(capacity=capacity))

    def grow(seq, tokens):
        seq.cache.capacity = max(seq.cache.capacity, -(-tokens // 64) * 64)
        return True
    # the third row's padding would pass the context: its lease stays (`pads` refuses it)
    for proposed, grown in (([[1, 2, 3], []], [64, 128, 512]), ([[], []], [64, 64, 512])):
        rows = [row(10, 64), row(62, 64), row(510, 512)]
        engine = SimpleNamespace(
            speculator=SimpleNamespace(k=3, kv_layers=0,
                                       draft_rows=lambda seqs, rooms: proposed + [[]]),
            memory=SimpleNamespace(grow=grow), runner=SimpleNamespace(chain=None),
            _draft_cap=lambda n: None, max_context=512)
        batch = StepPrepare._draft(engine, Batch(rows, [], list(rows)))
        assert [seq.cache.capacity for seq in rows] == grown
        assert batch.drafts == (proposed + [[]] if any(proposed) else [])
