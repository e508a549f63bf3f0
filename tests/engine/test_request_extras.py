"""The thinking cap, prefill progress and running timings through the real engine (tiny llama,
byte tokenizer)."""
from __future__ import annotations

import asyncio
import math

import pytest

from ninfer_engine.types import GenerationRequest

from .helpers import FakeArtifact
from .test_engine import GREEDY, PROMPT, _ascii_model, _engine

CLOSE = tuple(b"\nOK, answering now.\n</think>\n\n")
THINK_END = tuple(b"</think>")


@pytest.fixture(scope="module")
def artifact():
    return FakeArtifact(_ascii_model())


def _run(engine, *requests):
    async def collect(request):
        return [event async for event in engine.submit(request)]

    async def together():
        return await asyncio.gather(*(collect(r) for r in requests))

    return asyncio.run(together())


def _ids(events) -> list[int]:
    return [i for e in events for i in e.token_ids]


def _capped(rid: str, budget: int, end_ids=THINK_END, **kw) -> GenerationRequest:
    return GenerationRequest(rid, kw.pop("prompt_ids", PROMPT), GREEDY,
                             max_tokens=kw.pop("max_tokens", 48), thinking_budget=budget,
                             thinking_close_ids=CLOSE, think_end_ids=end_ids, **kw)


def test_cap_forces_the_close_then_sampling_continues(artifact):
    engine = _engine(artifact, max_concurrency=2)
    try:
        [free] = _run(engine, GenerationRequest("free", PROMPT, GREEDY, max_tokens=12))
        [capped] = _run(engine, _capped("capped", budget=5))
        # The rest must be what the model says after the close went through it, so a plain
        # request whose prompt already holds the reasoning and the close continues the same.
        answer = _ids(capped)[5 + len(CLOSE):]
        [replay] = _run(engine, GenerationRequest(
            "replay", PROMPT + tuple(_ids(capped)[:5 + len(CLOSE)]), GREEDY,
            max_tokens=len(answer)))
    finally:
        engine.stop()
    ids = _ids(capped)
    assert ids[:5] == _ids(free)[:5]
    assert tuple(ids[5:5 + len(CLOSE)]) == CLOSE
    assert len(answer) == 48 - 5 - len(CLOSE) and answer == _ids(replay)
    final = capped[-1]
    assert final.finish == "length" and final.usage.completion_tokens == 48
    text = "".join(e.text for e in capped)
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert bytes(CLOSE).decode() in text


def test_reasoning_closed_by_the_model_is_not_capped(artifact):
    engine = _engine(artifact)
    try:
        [free] = _run(engine, GenerationRequest("free", PROMPT, GREEDY, max_tokens=12))
        # The model's own third token plays `</think>`: reasoning ends before the budget of 4.
        end = _ids(free)[2]
        [closed] = _run(engine, _capped("closed", budget=4, end_ids=(end,), max_tokens=12))
        [capped] = _run(engine, _capped("capped", budget=4, end_ids=(), max_tokens=12))
    finally:
        engine.stop()
    assert _ids(closed) == _ids(free)
    assert tuple(_ids(capped)[4:12]) == CLOSE[:8]


def test_progress_events_per_prefill_chunk_before_the_first_token(artifact):
    engine = _engine(artifact)  # prefill chunks of 8
    try:
        [events] = _run(engine, GenerationRequest("p", PROMPT, GREEDY, max_tokens=4,
                                                  report_progress=True))
        [quiet] = _run(engine, GenerationRequest("q", PROMPT, GREEDY, max_tokens=4))
    finally:
        engine.stop()
    progress = [e.progress for e in events if e.progress is not None]
    total = len(PROMPT)
    assert len(progress) == math.ceil(total / 8)
    assert progress == [(total, 0, min(8 * (i + 1), total)) for i in range(len(progress))]
    first_token = next(i for i, e in enumerate(events) if e.token_ids)
    assert all(e.progress is None for e in events[first_token:])
    assert all(not e.text and not e.token_ids for e in events if e.progress is not None)
    assert not any(e.progress for e in quiet) and _ids(quiet) == _ids(events)


def test_progress_counts_reused_prompt_tokens(artifact):
    engine = _engine(artifact, device_state_slots=4)  # keeps the prompt-end checkpoint
    longer = PROMPT + tuple(b"<|im_start|>assistant\nhi<|im_end|>\n")
    try:
        _run(engine, GenerationRequest("first", PROMPT, GREEDY, max_tokens=2))
        [events] = _run(engine, GenerationRequest("second", longer, GREEDY, max_tokens=2,
                                                  report_progress=True))
    finally:
        engine.stop()
    cached = events[-1].usage.cached_tokens
    progress = [e.progress for e in events if e.progress is not None]
    assert cached > 0 and all(p[:2] == (len(longer), cached) for p in progress)
    processed = [p[2] for p in progress]
    assert processed == sorted(processed) and processed[0] > cached
    assert processed[-1] == len(longer)


def test_close_ids_outside_the_vocabulary_fail_only_that_request(artifact):
    engine = _engine(artifact)
    try:
        [bad] = _run(engine, GenerationRequest("bad", PROMPT, GREEDY, max_tokens=4,
                                               thinking_budget=2, thinking_close_ids=(10**6,)))
        [good] = _run(engine, _capped("good", budget=2, max_tokens=4))
    finally:
        engine.stop()
    assert bad[-1].finish == "error" and bad[-1].error.status == 400
    assert "thinking close" in bad[-1].error.message
    assert good[-1].finish == "length" and tuple(_ids(good)[2:]) == CLOSE[:2]


def test_text_events_carry_the_running_timings(artifact):
    engine = _engine(artifact)
    try:
        [events] = _run(engine, GenerationRequest("t", PROMPT, GREEDY, max_tokens=10))
    finally:
        engine.stop()
    *texts, final = [e for e in events if e.token_ids]
    assert all(e.timings is not None for e in texts)
    counts = [e.timings.predicted_n for e in texts]
    assert counts == [len(_ids(events[:events.index(e) + 1])) for e in texts]
    assert all(e.timings.prompt_n == len(PROMPT) for e in texts)
    assert len({e.timings.prefill_s for e in texts}) == 1
    assert texts[0].timings.prefill_s == final.timings.prefill_s
    decode = [e.timings.decode_s for e in [*texts, final]]
    assert decode == sorted(decode) and final.timings.predicted_n == 10
