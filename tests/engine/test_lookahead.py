"""The lookahead decode step (`step.lookahead`) against the ordinary step, on the real default
model's compiled CPU step (where a step is synchronous, so the lookahead only reorders the
engine's work: the same tokens must come out, and this is where CI checks its bookkeeping; on
the GPU it overlaps the host's work with the step in flight, tests/engine/test_lookahead_gpu.py).

Each scenario runs twice on fresh engines, lookahead off and forced on, and compares every
request's tokens and finish reason: greedy and seeded rows, requests ending by EOS and by
max_tokens at different steps (rows ending while a step is in flight), arrivals and a cancel in
the middle of a run of lookahead steps, and a second turn that reuses the first turn's
checkpoint (written after a lookahead step had already computed one more position)."""
from __future__ import annotations

import asyncio

import pytest
import torch

from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.config import EngineConfig
from ninfer_engine.kernels.cpu_decode import cpu_decode_unavailable
from ninfer_engine.types import GenerationRequest, SamplingParams

MODEL = default_artifact()

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not MODEL.exists(), reason=f"default model not prepared: {MODEL}"),
    pytest.mark.skipif(cpu_decode_unavailable() is not None, reason=f"{cpu_decode_unavailable()}"),
]

QUESTIONS = ["Name three colours.", "What is 2 + 2? Answer briefly.", "Say hi.",
             "List the days of the week.", "Write one word: yes."]


def _engine(lookahead: bool, **config):
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.engine import Engine

    engine = Engine(EngineConfig(artifact=MODEL, max_context=1024, max_concurrency=4,
                                 lookahead=lookahead, **config), open_artifact(MODEL))
    launched = engine.runner.forward_from
    engine.lookahead_steps = 0

    def counting(batch, tokens):
        engine.lookahead_steps += 1
        return launched(batch, tokens)
    engine.runner.forward_from = counting
    return engine


def _prompt(engine, question: str, answer: str | None = None, follow_up: str | None = None):
    messages = [{"role": "user", "content": question}]
    if answer is not None:
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return tuple(engine.tokenizer.encode(engine.chat_template.render(messages)))


async def _one(engine, rid, prompt, sampling, max_tokens, delay=0.0, cancel_after=None):
    await asyncio.sleep(delay)
    request = GenerationRequest(rid, prompt, sampling, max_tokens=max_tokens)
    tokens, reason = [], None
    async for event in engine.submit(request):
        tokens += event.token_ids
        reason = event.finish or reason
        if cancel_after is not None and len(tokens) >= cancel_after:
            engine.cancel(rid)
            cancel_after = None
    return tokens, reason


def _run(lookahead: bool, scenario, arrange=lambda engine: None, **config):
    engine = _engine(lookahead, **config)
    engine.start()
    arrange(engine)
    try:
        with torch.inference_mode():
            return asyncio.run(scenario(engine)), engine.lookahead_steps
    finally:
        engine.stop()


def _both(scenario):
    (plain, none), (ahead, steps) = _run(False, scenario), _run(True, scenario)
    assert none == 0
    assert steps > 10, "the lookahead path never ran: the test would prove nothing"
    return plain, ahead


def test_batched_greedy_and_seeded_rows_ending_at_different_steps():
    async def scenario(engine):
        greedy = SamplingParams(temperature=0.0)
        runs = [_one(engine, f"g{i}", _prompt(engine, q), greedy, 20 + 7 * i)
                for i, q in enumerate(QUESTIONS[:3])]
        runs += [_one(engine, f"s{i}", _prompt(engine, q),
                      SamplingParams(temperature=0.9, top_k=40, seed=11 + i), 33)
                 for i, q in enumerate(QUESTIONS[3:])]
        return await asyncio.gather(*runs)

    plain, ahead = _both(scenario)
    assert plain == ahead
    assert {reason for _, reason in plain} >= {"length"}


def test_arrivals_and_a_cancel_during_lookahead_steps():
    async def scenario(engine):
        greedy = SamplingParams(temperature=0.0)
        return await asyncio.gather(
            _one(engine, "a", _prompt(engine, QUESTIONS[0]), greedy, 60),
            _one(engine, "b", _prompt(engine, QUESTIONS[1]), greedy, 60, delay=0.15),
            _one(engine, "c", _prompt(engine, QUESTIONS[3]), greedy, 60, delay=0.3),
            _one(engine, "d", _prompt(engine, QUESTIONS[2]), greedy, 60, cancel_after=12))

    plain, ahead = _both(scenario)
    # arrival timing moves which step admits b and c, never their greedy tokens
    assert [t for t, _ in plain[:3]] == [t for t, _ in ahead[:3]]
    cancelled_plain, cancelled_ahead = plain[3], ahead[3]
    assert cancelled_plain[1] == cancelled_ahead[1] == "cancelled"
    # a cancel lands between steps: both runs agree on every token either one emitted
    common = min(len(cancelled_plain[0]), len(cancelled_ahead[0]))
    assert common >= 12 and cancelled_plain[0][:common] == cancelled_ahead[0][:common]


def test_a_second_turn_reuses_the_first_turns_checkpoint():
    async def scenario(engine):
        greedy = SamplingParams(temperature=0.0)
        first = _prompt(engine, QUESTIONS[2])
        tokens, reason = await _one(engine, "t1", first, greedy, 80)
        answer = engine.tokenizer.decode(tokens, skip_special_tokens=True)
        second = _prompt(engine, QUESTIONS[2], answer, "Now say bye.")
        hits = engine.memory.hit_tokens
        out = await _one(engine, "t2", second, greedy, 40)
        return (tokens, reason), out, engine.memory.hit_tokens - hits

    plain, ahead = _both(scenario)
    assert plain[:2] == ahead[:2]
    assert plain[0][1] == "stop", "the first answer should end by EOS for this test to bite"
    assert ahead[2] > 0 and plain[2] > 0  # the second turn started from the checkpoint


def test_penalized_rows_count_the_pick_in_flight():
    """Presence and frequency penalties (the Qwen3.5 presets carry presence_penalty 1.5) go
    ahead too: each lookahead pick counts the step in flight's token on the device, so the
    tokens are the ordinary path's."""
    async def scenario(engine):
        runs = [
            _one(engine, "pres", _prompt(engine, QUESTIONS[3]),
                 SamplingParams(temperature=0.0, presence_penalty=4.0), 48),
            _one(engine, "freq", _prompt(engine, QUESTIONS[3]),
                 SamplingParams(temperature=0.0, frequency_penalty=2.0), 48),
            _one(engine, "both", _prompt(engine, QUESTIONS[0]),
                 SamplingParams(temperature=0.8, top_k=40, seed=5, presence_penalty=0.5,
                                frequency_penalty=0.5), 40),
            _one(engine, "plain", _prompt(engine, QUESTIONS[3]), SamplingParams(temperature=0.0),
                 48)]
        return await asyncio.gather(*runs)

    plain, ahead = _both(scenario)
    assert plain == ahead
    # the penalties changed the answer: the test compares penalized tokens, not plain ones
    assert plain[0][0] != plain[3][0] and plain[1][0] != plain[3][0]


class _EveryThird:
    """A speculation policy that drafts on every third decision (the measured one follows
    step times, which differ between the runs compared)."""

    def __init__(self) -> None:
        self.asked = self.yes = 0

    def speculate(self, batch: int) -> bool:
        self.asked += 1
        self.yes += self.asked % 3 == 0
        return self.asked % 3 == 0

    def record(self, *args) -> None:
        pass


def test_plain_steps_under_spec_go_ahead_and_the_policy_still_drafts(monkeypatch):
    """`--spec ngram`: the steps the policy decodes plainly go ahead (`plain_next` asks it
    before each), and a step it wants drafted leaves the lookahead for a verify round; the
    tokens are those of the engine without lookahead, the drafts were verified, and the
    policy was asked once a step either way (every such step looks up: no pause after an
    empty lookup, the next test's)."""
    from ninfer_engine.step import speculation

    monkeypatch.setattr(speculation, "MAX_EMPTY_PAUSE", 0)
    policies = []

    def arrange(engine):
        engine.speculator.policy = _EveryThird()
        policies.append(engine.speculator)

    async def scenario(engine):
        greedy = SamplingParams(temperature=0.0)
        text = "Copy this list twice: apple, pear, plum, fig, lime, kiwi, date, apple, pear."
        return await asyncio.gather(*[_one(engine, f"r{i}", _prompt(engine, q), greedy, 40)
                                      for i, q in enumerate([text, QUESTIONS[3]])])

    config = {"spec": "ngram", "draft_tokens": 3}
    (plain, none), (ahead, steps) = (_run(False, scenario, arrange, **config),
                                     _run(True, scenario, arrange, **config))
    assert none == 0 and steps > 5
    assert plain == ahead
    for spec in policies:  # rounds verified in both runs, a third of the decisions drafting
        assert spec.counters.rounds > 0 and spec.policy.yes == spec.policy.asked // 3
    assert policies[0].policy.asked == policies[1].policy.asked


class _NeverRecording:
    """A speculation policy that never drafts and keeps the step times it is given."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def speculate(self, batch: int) -> bool:
        return False

    def record(self, batch: int, verified: bool, tokens: int, seconds: float) -> None:
        self.seconds.append(seconds)


def test_the_policy_times_a_step_gone_ahead_from_the_one_before_settling():
    """Plain steps under `--spec` go ahead (each launched before the one before is read), and
    the policy is given each one's own time, from the step before it settled to its own
    settling, not from its launch (which would count the step before as well: ~2x, and make
    verify steps look the faster). Each forward is slowed to `SLOW` seconds so a step's time
    is about one forward's."""
    import time

    SLOW = 0.08
    policies, forwards = [], []

    def slowed(method):
        def run(*args):
            begun = time.perf_counter()
            time.sleep(SLOW)
            out = method(*args)
            forwards.append(time.perf_counter() - begun)
            return out
        return run

    def arrange(engine):
        engine.speculator.policy = _NeverRecording()
        policies.append(engine.speculator.policy)
        engine.runner.forward = slowed(engine.runner.forward)
        engine.runner.forward_from = slowed(engine.runner.forward_from)

    async def scenario(engine):
        greedy = SamplingParams(temperature=0.0)
        return await _one(engine, "r", _prompt(engine, QUESTIONS[2]), greedy, 10)

    _, steps = _run(True, scenario, arrange, spec="ngram", draft_tokens=3)
    assert steps >= 6  # plain steps went ahead
    # each step settles one forward (plus host work) after the one before: under 1.5x, where
    # timing from the launch gives ~2x (the first one's launch, after the prompt's step, ran
    # its forward there: on the CPU a launch computes, so it pays the next launch's too)
    assert len(policies[0].seconds) >= 6
    decode = forwards[1:]  # the first is the prompt's
    assert max(policies[0].seconds[1:]) < 1.5 * max(decode)


def test_ngram_rows_that_find_nothing_pause_and_their_plain_steps_go_ahead():
    """`--spec ngram` drafting every step it can (`AlwaysSpeculate`) on answers that hardly
    repeat: a row whose lookup found nothing pauses before looking again, so its plain steps
    go ahead (without the pause no step would: each one asks the drafter first); the tokens
    are the engine's without lookahead."""
    from ninfer_engine.step.spec_policy import AlwaysSpeculate

    def arrange(engine):
        engine.speculator.policy = AlwaysSpeculate()

    async def scenario(engine):
        greedy = SamplingParams(temperature=0.0)
        return await asyncio.gather(*[_one(engine, f"r{i}", _prompt(engine, q), greedy, 32)
                                      for i, q in enumerate(QUESTIONS[:2])])

    config = {"spec": "ngram", "draft_tokens": 3}
    (plain, none), (ahead, steps) = (_run(False, scenario, arrange, **config),
                                     _run(True, scenario, arrange, **config))
    assert none == 0 and steps > 5
    assert plain == ahead
