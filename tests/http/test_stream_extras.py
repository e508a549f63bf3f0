"""The thinking cap's request side, `return_progress` and `timings_per_token` (contract §5, §8).

The scripted engine tokenizes one id per character, so the close ids are the guidance's
characters; its template opens `<think>` like Qwen's when thinking is on.
"""
from __future__ import annotations

import json

import openai
import pytest

from fake_engine import FakeEngine, RecordingTemplate, Script
from ninfer_http.prompt import THINKING_CLOSE

CLOSE_IDS = tuple(map(ord, THINKING_CLOSE))
USER = [{"role": "user", "content": "Hi"}]
THINKING_ON = {"chat_template_kwargs": {"enable_thinking": True}}


class ThinkingTemplate(RecordingTemplate):
    def render(self, messages, tools=None, add_generation_prompt=True, **template_kwargs) -> str:
        text = super().render(messages, tools, add_generation_prompt, **template_kwargs)
        return text + ("<think>\n" if template_kwargs.get("enable_thinking") else "")


def _engine(script: Script | None = None) -> FakeEngine:
    engine = FakeEngine(script)
    engine.chat_template = ThinkingTemplate()
    engine.max_context = 4096
    engine.default_max_tokens = 1024
    return engine


def anthropic(live, **fields):
    body = {"model": "claude-any", "max_tokens": 2048, "messages": USER, **fields}
    return live.request("POST", "/v1/messages", body)


def chunks_of(body: bytes) -> list[dict]:
    events = [b[len("data: "):] for b in body.decode().split("\n\n") if b.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_budget_tokens_and_close_ids_reach_the_engine(serve):
    live = serve(_engine())
    reply = anthropic(live, thinking={"type": "enabled", "budget_tokens": 1024})
    assert reply.status == 200, reply.body
    request = live.engine.submitted[-1]
    assert request.thinking_budget == 1024
    assert request.thinking_close_ids == CLOSE_IDS
    assert request.think_end_ids == tuple(map(ord, "</think>"))


def test_no_cap_without_thinking(serve):
    live = serve(_engine(), default_thinking_budget=64)
    assert anthropic(live, thinking={"type": "disabled"}).status == 200
    assert live.engine.submitted[-1].thinking_budget is None
    assert live.chat().status == 200  # the template's default here: thinking off
    request = live.engine.submitted[-1]
    assert request.thinking_budget is None and request.thinking_close_ids == ()


def test_budget_and_close_must_fit_the_output_limit(serve):
    live = serve(_engine())
    # 1024 + 118 close tokens + 1 answer token > 1100, though budget_tokens < max_tokens
    reply = anthropic(live, max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024})
    assert reply.status == 400
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "1024" in body["error"]["message"]
    assert anthropic(live, max_tokens=1024 + len(CLOSE_IDS) + 1,
                     thinking={"type": "enabled", "budget_tokens": 1024}).status == 200
    assert not live.engine.submitted[:-1]


def test_default_thinking_budget_on_every_protocol(serve):
    live = serve(_engine(), default_thinking_budget=64)
    assert live.chat(**THINKING_ON).status == 200
    assert live.engine.submitted[-1].thinking_budget == 64
    reply = live.request("POST", "/v1/responses", {
        "model": "fake-model", "input": "Hi", "chat_template_kwargs": {"enable_thinking": True}})
    assert reply.status == 200, reply.body
    assert live.engine.submitted[-1].thinking_budget == 64
    assert anthropic(live, thinking={"type": "adaptive"}).status == 200
    assert live.engine.submitted[-1].thinking_budget == 64
    too_small = live.chat(max_tokens=64 + len(CLOSE_IDS), **THINKING_ON)
    assert too_small.status == 400
    error = too_small.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error",
                                              "thinking_budget_capacity_insufficient")
    assert len(live.engine.submitted) == 3


def test_prompt_progress_chunks_come_before_the_content(serve):
    steps = ((40, 0, 16), (40, 0, 32), (40, 0, 40))
    live = serve(_engine(Script(progress=steps)))
    chunks = chunks_of(live.chat(stream=True, return_progress=True).body)
    assert live.engine.submitted[-1].report_progress
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    progress = [c for c in chunks if "prompt_progress" in c]
    assert chunks[1:4] == progress
    assert [tuple(c["prompt_progress"][k] for k in ("total", "cache", "processed"))
            for c in progress] == list(steps)
    times = [c["prompt_progress"]["time_ms"] for c in progress]
    assert times == sorted(times) and times[0] >= 0
    assert all(c["choices"][0]["delta"] == {} and c["choices"][0]["finish_reason"] is None
               for c in progress)
    assert [c["choices"][0]["delta"].get("content") for c in chunks[4:8]] == [
        "Hello", ", ", "world", "!"]


def test_progress_only_when_asked_and_streaming(serve):
    live = serve(_engine(Script(progress=((40, 0, 40),))))
    plain = chunks_of(live.chat(stream=True).body)
    assert not live.engine.submitted[-1].report_progress
    assert not any("prompt_progress" in c for c in plain)
    assert live.chat(return_progress=True).status == 200
    assert not live.engine.submitted[-1].report_progress


def _texts(chunk) -> tuple[str | None, str | None]:
    """(reasoning_content, content) of a chunk's delta; the SDK keeps the former as an extra."""
    delta = chunk.choices[0].delta
    return delta.model_extra.get("reasoning_content"), delta.content


def test_timings_per_token_on_reasoning_and_content_chunks(serve):
    live = serve(_engine(Script(pieces=("Let me", " think.", "</think>", "\n\nHi", "!"))))
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0,
                           timeout=10)
    stream = client.chat.completions.create(
        model="fake-model", messages=USER, stream=True,
        extra_body={"timings_per_token": True, **THINKING_ON})
    chunks = [c for c in stream if c.choices and any(_texts(c))]
    deltas = [_texts(c) for c in chunks]
    assert deltas == [("Let me", None), (" think.", None), (None, "Hi"), (None, "!")]
    timings = [c.model_extra["timings"] for c in chunks]
    # The engine's running timings of the event each delta came from: one token per piece,
    # "</think>" among them (its chunk is the reasoning's end, which has no text).
    assert [t["predicted_n"] for t in timings] == [1, 2, 4, 5]
    assert all(t["prompt_n"] == 10 and t["prompt_ms"] == pytest.approx(20.0) for t in timings)


def test_no_per_token_timings_unless_asked(live):
    chunks = chunks_of(live.chat(stream=True).body)
    assert not any("timings" in c for c in chunks[:-1])
    assert "timings" in chunks[-1]


@pytest.mark.parametrize("value", ["yes", 1])
def test_flags_must_be_booleans(live, value):
    for flag in ("timings_per_token", "return_progress"):
        reply = live.chat(stream=True, **{flag: value})
        assert reply.status == 400 and reply.json()["error"]["param"] == flag
