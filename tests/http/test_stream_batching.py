"""Events that reach a stream together (its reader was behind the engine) leave in one write,
and the client reads the same events as when they arrive one by one."""
from __future__ import annotations

import json

import pytest
from aiohttp import web

from fake_engine import FakeEngine, Script
from ninfer_engine.step.event_pump import EventStream
from ninfer_engine.types import TokenEvent, Usage

PIECES = ("Hello", ", ", "wor", "ld", "!")


class BurstEngine(FakeEngine):
    """Every event of the script is already in the stream when the reader first looks."""

    def submit(self, request):
        self.submitted.append(request)
        stream = EventStream()
        for i, piece in enumerate(self.script.pieces):
            stream.put(TokenEvent(text=piece, token_ids=(i + 1,)))
        stream.put(TokenEvent(finish="stop", usage=Usage(len(request.prompt_ids),
                                                          len(self.script.pieces))))
        return stream


def _events(body: bytes) -> list:
    """The SSE payloads, without the fields that differ between two requests."""
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            payload = json.loads(line[6:])
            for volatile in ("id", "created", "timings"):
                payload.pop(volatile, None)
            out.append(payload)
    return out


@pytest.mark.parametrize("engine_type", [FakeEngine, BurstEngine])
def test_a_burst_of_events_leaves_in_one_write(serve, monkeypatch, engine_type):
    writes = []
    original = web.StreamResponse.write

    async def counting_write(self, data):
        writes.append(data)
        return await original(self, data)
    monkeypatch.setattr(web.StreamResponse, "write", counting_write)
    live = serve(engine=engine_type(Script(pieces=PIECES)))
    reply = live.chat(stream=True, stream_options={"include_usage": True}, max_tokens=16)
    assert reply.status == 200
    events = _events(reply.body)
    deltas = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    assert "".join(d for d in deltas if d) == "".join(PIECES)
    assert events[-1]["usage"]["completion_tokens"] == len(PIECES)
    if engine_type is BurstEngine:
        assert len(writes) == 1  # role, five tokens, finish, usage and [DONE] together
    else:
        assert len(writes) >= len(PIECES)  # one by one: each token as it arrives


def test_a_burst_reads_the_same_as_one_by_one(serve):
    bodies = []
    for engine_type in (FakeEngine, BurstEngine):
        live = serve(engine=engine_type(Script(pieces=PIECES)))
        reply = live.chat(stream=True, stream_options={"include_usage": True}, max_tokens=16)
        bodies.append(_events(reply.body))
    assert bodies[0] == bodies[1]


def test_a_burst_keeps_reasoning_content_and_tool_calls_apart(serve):
    """A burst that crosses the end of the reasoning and the tool calls: the same deltas and
    the same `reasoning_tokens` as one by one (each event is split in its own state)."""
    from test_tools_thinking import OPENAI_TOOLS, PIECES as THINKING, QwenLikeTemplate
    bodies = []
    for engine_type in (FakeEngine, BurstEngine):
        engine = engine_type(Script(pieces=THINKING))
        engine.chat_template, engine.max_context = QwenLikeTemplate(), 4096
        reply = serve(engine=engine).chat(
            stream=True, stream_options={"include_usage": True}, tools=OPENAI_TOOLS,
            chat_template_kwargs={"enable_thinking": True})
        events = _events(reply.body)
        for event in events:  # tool call ids are random
            for choice in event["choices"]:
                for call in choice["delta"].get("tool_calls") or ():
                    call.pop("id", None)
        bodies.append(events)
    assert bodies[0] == bodies[1]
    assert bodies[1][-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
