"""The engine end to end through asyncio with a tiny random model and a byte tokenizer."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from ninfer_engine import engine as engine_module
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine, EngineLoadError
from ninfer_engine.step import postprocess
from ninfer_engine.types import EngineState, GenerationRequest, SamplingParams

from .helpers import FakeArtifact, tiny_llama

GREEDY = SamplingParams(temperature=0.0)
PROMPT = tuple(b"<|im_start|>user\nhello there<|im_end|>\n")


def _ascii_model():
    """Untied head whose non-ASCII rows are zero, so greedy text is mostly printable ASCII."""
    model = tiny_llama(seed=4, vocab_size=259, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight[128:] = 0.0
    return model


@pytest.fixture(scope="module")
def artifact():
    return FakeArtifact(_ascii_model())


def _engine(artifact, **overrides) -> Engine:
    config = EngineConfig(artifact=Path("tiny.ninfer"), **{"prefill_chunk": 8, **overrides})
    engine = Engine(config, artifact)
    engine.start()
    return engine


async def _collect(engine, request):
    return [event async for event in engine.submit(request)]


def _request(rid="r", max_tokens=12, **kw) -> GenerationRequest:
    return GenerationRequest(rid, kw.pop("prompt_ids", PROMPT), kw.pop("sampling", GREEDY),
                             max_tokens=max_tokens, **kw)


def _wait_idle(engine, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = engine.snapshot().queue
        if not q.pending and not q.running:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine still busy: {engine.snapshot().queue}")


def test_greedy_generation_to_length(artifact):
    engine = _engine(artifact)
    try:
        events = asyncio.run(_collect(engine, _request(max_tokens=12)))
    finally:
        engine.stop()
    final = events[-1]
    ids = [i for e in events for i in e.token_ids]
    assert final.finish == "length" and all(e.finish is None for e in events[:-1])
    assert len(ids) == 12 and final.usage.completion_tokens == 12
    assert final.usage.prompt_tokens == len(PROMPT)
    assert "".join(e.text for e in events) == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert final.timings.predicted_n == 12 and final.timings.prompt_n == len(PROMPT)


def test_the_first_token_is_stamped_once_its_step_s_tokens_reached_the_host(artifact,
                                                                          monkeypatch):
    """TTFT ends when the token is on the host: on a GPU the read waits for the step's kernels,
    which outlast its launches for a big prompt step, so that wait belongs in it (a stamp
    before the read made a kernel-bound step's TTFT ~10 ms early). The read here waits 0.3 s;
    the rest of this prompt's steps take a few ms."""
    real, slept = postprocess.next_tokens, []

    def waiting_read(seqs, logits):
        if not slept:
            slept.append(time.sleep(0.3))
        return real(seqs, logits)

    monkeypatch.setattr(postprocess, "next_tokens", waiting_read)
    engine = _engine(artifact)
    try:
        final = asyncio.run(_collect(engine, _request(max_tokens=1)))[-1]
    finally:
        engine.stop()
    assert slept and final.timings.queue_s + final.timings.prefill_s >= 0.3


def test_same_tokens_alone_and_batched(artifact):
    engine = _engine(artifact, max_concurrency=3)
    prompts = [PROMPT, PROMPT[:20], tuple(b"abc")]

    async def together():
        return await asyncio.gather(*(_collect(engine, _request(f"r{i}", 10, prompt_ids=p))
                                      for i, p in enumerate(prompts)))

    try:
        alone = [asyncio.run(_collect(engine, _request("a", 10, prompt_ids=p))) for p in prompts]
        batched = asyncio.run(together())
    finally:
        engine.stop()
    ids = lambda events: [i for e in events for i in e.token_ids]  # noqa: E731
    assert [ids(e) for e in batched] == [ids(e) for e in alone]


def test_stop_string_is_withheld(artifact):
    engine = _engine(artifact)
    try:
        full = "".join(e.text for e in asyncio.run(_collect(engine, _request(max_tokens=24))))
        stop = full[10:13]
        events = asyncio.run(_collect(engine, _request(max_tokens=24, stop=("zzzz", stop))))
    finally:
        engine.stop()
    text = "".join(e.text for e in events)
    assert events[-1].finish == "stop" and events[-1].stop_sequence == stop
    assert text == full[: full.index(stop)]


def test_max_tokens_zero_prefills_only(artifact):
    engine = _engine(artifact)
    try:
        events = asyncio.run(_collect(engine, _request(max_tokens=0)))
    finally:
        engine.stop()
    admission, final = events
    assert admission.finish is None and admission.text == "" and not admission.token_ids
    assert final.finish == "length" and final.text == ""
    assert final.usage.completion_tokens == 0
    assert final.usage.prompt_tokens == len(PROMPT)


def test_cancellation_frees_the_request(artifact):
    engine = _engine(artifact, no_prefix_reuse=True)  # no checkpoint keeps pages

    async def read_two_then_close():
        gen = engine.submit(_request(max_tokens=10_000, sampling=SamplingParams(seed=1)))
        got = [await gen.__anext__(), await gen.__anext__()]
        await gen.aclose()
        return got

    async def cancel_consumer_task():
        started = asyncio.Event()

        async def consume():
            async for _ in engine.submit(_request("t", 10_000)):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    try:
        got = asyncio.run(read_two_then_close())
        _wait_idle(engine)
        snap = engine.snapshot()
        asyncio.run(cancel_consumer_task())
        _wait_idle(engine)
        after_task = engine.snapshot()
    finally:
        engine.stop()
    assert all(e.finish is None for e in got)
    assert snap.counters.requests_cancelled == 1 and snap.kv.used == 0
    assert after_task.counters.requests_cancelled == 2 and not engine.scheduler.running


def test_max_concurrency_is_respected(artifact, monkeypatch):
    monkeypatch.setattr(engine_module, "BUSY_PUBLISH_S", 0.0)  # a snapshot every step
    engine = _engine(artifact, max_concurrency=2)
    seen: list[int] = []
    forward = engine.runner.forward

    queues = []

    def recording_forward(batch):
        seen.append(len(engine.scheduler.running))
        queues.append(engine.snapshot().queue)
        return forward(batch)

    engine.runner.forward = recording_forward

    async def four():
        return await asyncio.gather(*(_collect(engine, _request(f"r{i}", 6)) for i in range(4)))

    try:
        results = asyncio.run(four())
    finally:
        engine.stop()
    assert max(seen) == 2
    assert all(r[-1].finish == "length" for r in results)
    assert max(len(q.running) for q in queues) == 2
    assert any(q.pending and q.pending[0].phase == "queued" for q in queues)
    assert {v.phase for q in queues for v in q.running} == {"prefill", "decode"}


def test_pending_request_times_out(artifact):
    engine = _engine(artifact, max_concurrency=1, pending_timeout_ms=50)

    async def pair():
        return await asyncio.gather(_collect(engine, _request("long", 400)),
                                    _collect(engine, _request("waits", 4)))

    try:
        long, waits = asyncio.run(pair())
    finally:
        engine.stop()
    assert long[-1].finish == "length"
    assert waits[-1].finish == "error"
    assert (waits[-1].error.status, waits[-1].error.code) == (503, "request_queue_timeout")


def test_failure_in_one_request_fails_only_that_request(artifact, monkeypatch):
    monkeypatch.setenv("NINFER_FAULT", "request:bad")
    engine = _engine(artifact, max_concurrency=2)

    async def pair():
        return await asyncio.gather(_collect(engine, _request("bad", 8)),
                                    _collect(engine, _request("good", 8)))

    try:
        bad, good = asyncio.run(pair())
        bad_prompt = asyncio.run(_collect(engine, _request("oov", 4, prompt_ids=(1, 999))))
        state = engine.state
    finally:
        engine.stop()
    assert bad[-1].finish == "error" and "injected" in bad[-1].error.message
    assert good[-1].finish == "length" and good[-1].usage.completion_tokens == 8
    assert bad_prompt[-1].finish == "error" and bad_prompt[-1].error.status == 400
    assert state is EngineState.READY


def test_engine_failure_fails_everything_with_503(artifact, monkeypatch):
    monkeypatch.setenv("NINFER_FAULT", "step:3")
    reasons: list[str] = []
    config = EngineConfig(artifact=Path("tiny.ninfer"), max_concurrency=1, prefill_chunk=8)
    engine = Engine(config, artifact, on_failure=reasons.append)
    engine.start()

    async def pair():
        return await asyncio.gather(_collect(engine, _request("a", 50)),
                                    _collect(engine, _request("b", 50)))

    a, b = asyncio.run(pair())
    engine._thread.join(5)
    assert engine.state is EngineState.FAILED and not engine._thread.is_alive()
    for events in (a, b):
        assert events[-1].finish == "error"
        assert (events[-1].error.status, events[-1].error.code) == (503, "service_unavailable")
    assert len(reasons) == 1 and "injected" in reasons[0]
    assert engine.snapshot().state == "failed"
    late = asyncio.run(_collect(engine, _request("late", 4)))
    assert late[-1].error.status == 503


def test_identity_and_sampling_defaults(artifact):
    config = EngineConfig(artifact=Path("x.ninfer"), top_k=5, seed=9, max_context=512)
    engine = Engine(config, artifact)
    assert engine.model_id == "tiny-test" and engine.max_context == 512
    assert engine.sampling_defaults == SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=9)
    greedy = Engine(EngineConfig(artifact=Path("x.ninfer"), greedy=True, model_id="m"), artifact)
    assert greedy.sampling_defaults.greedy and greedy.model_id == "m"
    assert engine.tokenizer.eos_token_ids == (257,)
    assert engine.chat_template.render([{"role": "user", "content": "x"}]).endswith("assistant\n")


def test_snapshots_are_published_while_idle(artifact):
    engine = _engine(artifact)
    try:
        first = engine.snapshot().at
        time.sleep(0.6)
        second = engine.snapshot()
    finally:
        engine.stop()
    assert second.at > first and second.state == "ready"
    assert second.host.total > 0 and second.devices[0].weights > 0


def test_load_failure_is_clear():
    with pytest.raises(EngineLoadError, match="missing.ninfer"):
        Engine(EngineConfig(artifact=Path("missing.ninfer")))
