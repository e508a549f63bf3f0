"""A burst's prompts share one prompt step: the front end counts the generation requests it is
still preparing (`arrival.Preparing`), each hand-over tells the engine how many are behind it,
and the queued requests wait for them within `ARRIVAL_WINDOW_S` of the newest queued
hand-over, at most `GATHER_LIMIT_S` past the oldest arrival (`Scheduler.arrival_wait`,
`StepPrepare._gather`): the engine sleeps when nothing decodes, and runs decode-only steps
meanwhile when rows decode."""
from __future__ import annotations

import time

import pytest

from ninfer_engine.arrival import Arrival, Preparing
from ninfer_engine.step.scheduler import ARRIVAL_WINDOW_S, GATHER_LIMIT_S, Scheduler
from ninfer_engine.step.sequence import Sequence
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import FakeArtifact, tiny_llama
from .test_speculation import _engine


def _sequence(name: str, prompt_len: int, arrived: float, handed: float | None = None
              ) -> Sequence:
    request = GenerationRequest(name, tuple(range(1, prompt_len + 1)),
                                SamplingParams(temperature=0.0), max_tokens=4)
    return Sequence(request, lambda event: None, None, None, frozenset(), arrived=arrived,
                    handed=handed)


def test_a_prompt_step_waits_only_for_announced_requests_within_the_window():
    scheduler = Scheduler(4, 100, 60.0, admit=lambda seq: True)
    assert scheduler.arrival_wait(0.0, 3) == 0.0  # nothing queued: nothing to hold back
    scheduler.add(_sequence("a", 10, arrived=1.0))
    assert scheduler.arrival_wait(1.002, 0) == 0.0  # nobody announced
    assert scheduler.arrival_wait(1.002, 2) == pytest.approx(ARRIVAL_WINDOW_S - 0.002)
    assert scheduler.arrival_wait(1.0 + ARRIVAL_WINDOW_S + 1e-6, 2) == 0.0  # window spent
    scheduler.add(_sequence("b", 95, arrived=1.001))
    assert scheduler.arrival_wait(1.002, 2) == 0.0  # the step's prompt budget is full
    full, _ = scheduler.schedule(1.002)
    for chunk in full.chunks:  # both prompts in: they decode next
        chunk.seq.cached += chunk.tokens
        chunk.seq.output.append(7)
    scheduler.add(_sequence("c", 5, arrived=1.003))
    assert scheduler.decoding
    assert scheduler.arrival_wait(1.004, 2) == pytest.approx(ARRIVAL_WINDOW_S - 0.001)
    assert not scheduler.may_admit(1.004, 2)  # a step ahead may go on decoding
    held, _ = scheduler.schedule(1.004, admit=False)  # "c" stays queued; the rest run
    assert [s.id for s in held.decode] == ["a"]  # "b" got 90 of its 95 tokens in the budget
    assert [(c.seq.id, c.tokens) for c in held.chunks] == [("b", 5)]
    assert [s.id for s in scheduler.queued()] == ["c"]
    assert scheduler.may_admit(1.003 + ARRIVAL_WINDOW_S + 1e-6, 2)  # its window is spent
    cancelled = _sequence("d", 5, arrived=1.004)
    scheduler.add(cancelled)
    scheduler.pending.rotate(1)  # "d" at the head
    cancelled.cancelled = True
    assert scheduler.may_admit(1.005, 2)  # a cancelled head is taken out at once


def test_each_arrival_of_a_burst_extends_the_wait_up_to_the_limit():
    """A burst whose requests reach the engine one by one, each while others are still being
    prepared, keeps waiting a window past its newest arrival, never past the limit counted
    from its oldest."""
    scheduler = Scheduler(8, 1000, 60.0, admit=lambda seq: True)
    scheduler.add(_sequence("a", 10, arrived=1.0))
    later = 1.0 + 0.8 * ARRIVAL_WINDOW_S
    scheduler.add(_sequence("b", 10, arrived=later))
    now = 1.0 + ARRIVAL_WINDOW_S + 1e-4  # the oldest's window is spent, the newest's is not
    assert scheduler.arrival_wait(now, 3) == pytest.approx(later + ARRIVAL_WINDOW_S - now)
    last = 1.0 + GATHER_LIMIT_S - 0.2 * ARRIVAL_WINDOW_S
    scheduler.add(_sequence("c", 10, arrived=last))
    assert scheduler.arrival_wait(last, 2) == pytest.approx(1.0 + GATHER_LIMIT_S - last)
    assert scheduler.arrival_wait(1.0 + GATHER_LIMIT_S + 1e-6, 2) == 0.0  # the limit


def test_the_window_runs_from_the_hand_over_of_a_request_the_front_end_held():
    """A burst that arrived while the front end was busy (its last streams ending) reaches the
    engine late: the window counts from the newest hand-over, still never past the limit from
    the oldest arrival."""
    scheduler = Scheduler(8, 1000, 60.0, admit=lambda seq: True)
    handed = 1.0 + 1.5 * ARRIVAL_WINDOW_S  # prepared past a window counted from its arrival
    scheduler.add(_sequence("a", 10, arrived=1.0, handed=handed))
    assert scheduler.arrival_wait(handed, 7) == pytest.approx(ARRIVAL_WINDOW_S)
    assert scheduler.arrival_wait(handed + ARRIVAL_WINDOW_S + 1e-6, 7) == 0.0
    late = 1.0 + GATHER_LIMIT_S - 0.5 * ARRIVAL_WINDOW_S
    scheduler.add(_sequence("b", 10, arrived=1.0, handed=late))
    assert scheduler.arrival_wait(late, 6) == pytest.approx(1.0 + GATHER_LIMIT_S - late)


def test_the_front_end_counts_each_request_until_its_hand_over_or_end():
    preparing = Preparing()
    first, second = Arrival(0.0, hold=preparing.hold()), Arrival(0.0, hold=preparing.hold())
    assert preparing.count == 2
    assert first.hand_over() == 1 and first.hand_over() == 1  # once: idempotent
    assert second.hold.release() == 0 and second.hand_over() == 0  # ended before hand-over
    assert preparing.count == 0 and Arrival(0.0).hand_over() == 0  # no hold: not counted


@pytest.fixture
def gathering(monkeypatch):
    """(an engine whose window is seconds wide, the prompt ids each step computes): on a loaded
    machine the test thread may sleep past 10 ms."""
    from ninfer_engine.step import scheduler

    monkeypatch.setattr(scheduler, "ARRIVAL_WINDOW_S", 5.0)
    monkeypatch.setattr(scheduler, "GATHER_LIMIT_S", 15.0)
    engine = _engine(FakeArtifact(tiny_llama(seed=5, vocab_size=259)), None, max_concurrency=4,
                     prefill_chunk=256)
    steps = []
    forward = engine.runner.forward
    engine.runner.forward = lambda batch: steps.append(
        sorted(c.seq.id for c in batch.chunks)) or forward(batch)
    try:
        yield engine, steps
    finally:
        engine.stop()


def test_the_engine_gathers_a_burst_into_one_prompt_step(gathering):
    """A request handed over while another is announced waits for it: both prompts are
    computed in the first step; handed over with none behind it, a request starts at once."""
    engine, steps = gathering
    prompt = tuple(range(3, 40))
    sampling = SamplingParams(temperature=0.0)
    ended = []

    def add(name: str, ids: tuple[int, ...], preparing: int) -> None:
        engine.add(GenerationRequest(name, ids, sampling, max_tokens=2),
                   lambda e: e.finish and ended.append(name), time.monotonic(), preparing)

    def settle(count: int) -> None:
        deadline = time.monotonic() + 30
        while len(ended) < count and time.monotonic() < deadline:
            time.sleep(0.002)

    add("a", prompt, preparing=1)
    time.sleep(0.05)
    add("b", prompt[1:], preparing=0)
    settle(2)
    assert steps[0] == ["a", "b"]
    steps.clear()
    started = time.monotonic()
    add("c", prompt, preparing=0)
    settle(3)
    assert steps[0] == ["c"] and time.monotonic() - started < 2.5  # not the 5-s window


def test_rows_decode_while_a_burst_arriving_beside_them_is_gathered(gathering):
    """With a row decoding, a request handed over while another is announced neither holds the
    row up nor starts alone: decode-only steps run until the announced one is handed over, and
    both prompts are computed in one step."""
    engine, steps = gathering
    prompt = tuple(range(3, 40))
    ended, tokens = [], []

    def add(name: str, max_tokens: int, preparing: int) -> None:
        def emit(event) -> None:
            if name == "a":
                tokens.extend(event.token_ids)
            if event.finish:
                ended.append(name)
        request = GenerationRequest(name, prompt, SamplingParams(temperature=0.0),
                                    max_tokens=max_tokens, ignore_eos=True)
        engine.add(request, emit, time.monotonic(), preparing)

    def until(done, what: str) -> None:
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            time.sleep(0.002)
        assert done(), what

    add("a", 300, preparing=0)  # with b and c, within the pool of the 512-token context
    until(lambda: len(tokens) >= 2, "a decodes")
    add("b", 2, preparing=1)
    before = len(tokens)
    until(lambda: len(tokens) >= before + 5, "a decodes while b waits")  # not held up
    add("c", 2, preparing=0)
    until(lambda: {"b", "c"} <= set(ended), "b and c end")
    assert [chunks for chunks in steps if chunks] == [["a"], ["b", "c"]]  # b not alone
    assert "a" not in ended  # it decoded all along
