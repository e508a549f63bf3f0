"""Chat Completions (§5) through the official `openai` SDK and raw HTTP."""
from __future__ import annotations

import json
import math
import re

import openai
import pytest

from fake_engine import Script
from ninfer_engine.types import EngineError, SamplingParams

TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
               "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


def sdk(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def sse_events(body: bytes) -> list[str]:
    """The `data:` payloads and comments of an SSE body, in order."""
    blocks = [b for b in body.decode().split("\n\n") if b]
    return [b[len("data: "):] if b.startswith("data: ") else b for b in blocks]


def prompt_length(live) -> int:
    return len(live.engine.submitted[-1].prompt_ids)


def test_sdk_non_stream(live):
    live.engine.script = Script(cached_tokens=3)
    completion = sdk(live).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Hi"}])
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", completion.id)
    assert completion.object == "chat.completion"
    assert completion.model == "fake-model"
    [choice] = completion.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello, world!"
    assert choice.message.refusal is None
    assert choice.finish_reason == "stop"
    usage = completion.usage
    assert usage.prompt_tokens == prompt_length(live)
    assert usage.completion_tokens == 4
    assert usage.total_tokens == usage.prompt_tokens + 4
    assert usage.prompt_tokens_details.cached_tokens == 3
    assert usage.completion_tokens_details.reasoning_tokens == 0
    timings = completion.model_extra["timings"]
    assert set(timings) == TIMING_KEYS
    assert timings["prompt_n"] == 10 and timings["predicted_n"] == 4
    assert timings["predicted_per_second"] == pytest.approx(3 / 0.03)
    assert all(math.isfinite(v) for v in timings.values())


def test_sdk_stream_with_usage(live):
    chunks = list(sdk(live).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    *others, last = chunks
    assert all(c.usage is None for c in others)
    assert last.choices == []
    assert last.usage.prompt_tokens == prompt_length(live)
    assert last.usage.completion_tokens == 4
    assert set(last.model_extra["timings"]) == TIMING_KEYS
    assert len({c.id for c in chunks}) == 1


def test_raw_stream_order_headers_and_done(live):
    reply = live.chat(stream=True)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["cache-control"] == "no-cache"
    assert reply.headers["x-accel-buffering"] == "no"
    events = sse_events(reply.body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert contents == ["Hello", ", ", "world", "!"]
    finish = chunks[-1]
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "stop"
    assert set(finish["timings"]) == TIMING_KEYS


def test_length_finish_reason(live):
    live.engine.script = Script(finish="length")
    assert live.chat().json()["choices"][0]["finish_reason"] == "length"


def test_model_must_match(live):
    reply = live.chat(model="gpt-4o")
    assert reply.status == 404
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_found", "model", "invalid_request_error")


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "fake-model"}, "messages"),
    ({"model": "fake-model", "messages": [{"role": "user"}]}, "messages[0].content"),
])
def test_missing_required_parameter(live, body, param):
    reply = live.request("POST", "/v1/chat/completions", body)
    assert reply.status == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("missing_required_parameter", param)


@pytest.mark.parametrize("fields, param", [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 21}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"min_p": -0.1}, "min_p"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"seed": 2**64}, "seed"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 7}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
    ({"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}},
     "enable_thinking"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
])
def test_invalid_values(live, fields, param):
    reply = live.chat(**fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "invalid_value", param, "invalid_request_error")
    assert live.engine.submitted == []


IMAGE = {"url": "https://example.com/cat.png", "detail": "high"}


@pytest.mark.parametrize("fields, param", [
    ({"grammar": "root ::= x"}, "grammar"),
    # the scripted engine's tokenizer cannot drive a grammar: a clear refusal, not a hang
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}],
      "tool_choice": "required"}, "tool_choice"),
    ({"structured_outputs": {"json": {}}}, "structured_outputs"),
    ({"guided_json": {}}, "guided_json"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"store": True}, "store"),
    ({"repetition_penalty": 1.1}, "repetition_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": IMAGE}]}]},
     "messages[0].content[0].detail"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]},
     "messages[0].content[0]"),
])
def test_rejected_fields(live, fields, param):
    reply = live.chat(**fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    assert live.engine.submitted == []


@pytest.mark.parametrize("fields, param", [
    ({"n": 9}, "n"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
     "response_format.schema"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
     "tools[0].function.strict"),
    # a strict tool under `auto`: its schema must compile, though the call is optional
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                  "parameters": {"type": "x"}}}]}, "tools"),
])
def test_invalid_values_of_served_fields(live, fields, param):
    reply = live.chat(**fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert live.engine.submitted == []


def test_n_choices_run_one_engine_request_each(live):
    reply = live.chat(n=3, seed=5)
    assert reply.status == 200, reply.body
    body = reply.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "Hello, world!" for c in body["choices"])
    seeds = sorted(r.sampling.seed for r in live.engine.submitted)
    assert seeds == [5, 6, 7]  # choices differ by seed
    assert len({r.request_id for r in live.engine.submitted}) == 3
    assert body["usage"]["completion_tokens"] == 3 * 4


def test_n_choices_stream_interleaved_by_index(live):
    live.engine.script = Script(delay_s=0.02)  # the choices' pieces arrive in turns
    reply = live.chat(n=3, seed=5, stream=True, stream_options={"include_usage": True})
    assert reply.status == 200, reply.body
    events = sse_events(reply.body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    *deltas, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3 * 4
    assert all(len(c["choices"]) == 1 for c in deltas)
    order = [c["choices"][0]["index"] for c in deltas]
    for index in range(3):
        own = [c["choices"][0] for c in deltas if c["choices"][0]["index"] == index]
        assert own[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in own[1:-1]) == "Hello, world!"
        assert own[-1]["delta"] == {} and own[-1]["finish_reason"] == "stop"
    # interleaved as they arrived, not one choice after another
    assert order.index(2) < len(order) - 1 - order[::-1].index(0)
    assert sorted(r.sampling.seed for r in live.engine.submitted) == [5, 6, 7]


def test_n_choices_stream_through_the_sdk(live):
    with sdk(live).chat.completions.stream(model="fake-model", n=2, messages=[
            {"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_completion()
    assert [(c.index, c.message.content, c.finish_reason) for c in final.choices] == [
        (0, "Hello, world!", "stop"), (1, "Hello, world!", "stop")]


def test_n_choices_stream_ends_at_the_first_failure(live):
    live.engine.script = Script(fail=EngineError("step loop broke", "service_unavailable", 503))
    events = sse_events(live.chat(n=2, stream=True).body)
    assert "[DONE]" not in events
    errors = [json.loads(e) for e in events if "error" in json.loads(e)]
    assert len(errors) == 1 and json.loads(events[-1]) == errors[0]
    assert errors[0]["error"]["code"] == "service_unavailable"


def test_parallel_tool_calls_false_returns_one_call(live):
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    live.engine.script.pieces = (call, call)
    tools = [{"type": "function", "function": {"name": "f"}}]
    both = live.chat(tools=tools).json()["choices"][0]["message"]["tool_calls"]
    one = live.chat(tools=tools, parallel_tool_calls=False).json()
    assert len(both) == 2 and len(one["choices"][0]["message"]["tool_calls"]) == 1


def test_media_is_rejected_while_vision_is_off(live):
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    reply = live.chat(messages=[{"role": "user", "content": [part]}])
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "vision_disabled"


def test_neutral_values_and_unknown_keys_are_ignored(live):
    reply = live.chat(logit_bias={"42": 0}, logprobs=False, top_logprobs=0, store=False, n=1,
                      response_format={"type": "text"}, metadata={"k": "v"}, user="u",
                      service_tier="auto", repetition_penalty=1, prediction={"type": "content"},
                      parallel_tool_calls=False, some_future_field={"x": 1})
    assert reply.status == 200, reply.body


def test_context_length_exceeded(live):
    reply = live.chat(messages=[{"role": "user", "content": "x" * 300}])
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["max_context"] == 256
    assert error["prompt_tokens"] == len("<user>" + "x" * 300 + "\n<assistant>")
    assert live.engine.submitted == []


def test_prompt_filling_all_but_one_token_is_accepted(live):
    overhead = len("<user>\n<assistant>")
    reply = live.chat(messages=[{"role": "user", "content": "x" * (255 - overhead)}])
    assert reply.status == 200
    assert live.engine.submitted[-1].max_tokens == 1


def test_max_tokens_default_request_and_context_clamp(live):
    live.chat()
    assert live.engine.submitted[-1].max_tokens == 64  # the engine default
    live.chat(max_tokens=5)
    assert live.engine.submitted[-1].max_tokens == 5
    live.chat(max_tokens=5, max_completion_tokens=7)
    assert live.engine.submitted[-1].max_tokens == 7
    live.chat(max_completion_tokens=0)
    assert live.engine.submitted[-1].max_tokens == 0
    live.chat(max_tokens=10_000)
    assert live.engine.submitted[-1].max_tokens == 256 - prompt_length(live)


def test_stop_strings_reach_the_engine(live):
    live.chat(stop="END")
    assert live.engine.submitted[-1].stop == ("END",)
    live.chat(stop=["a", "b", "", "d"])
    assert live.engine.submitted[-1].stop == ("a", "b", "d")
    live.chat()
    assert live.engine.submitted[-1].stop == ()


def test_sampler_defaults_then_request_fields(live):
    live.chat()
    assert live.engine.submitted[-1].sampling == live.engine.sampling_defaults
    live.chat(temperature=0, top_k=5, min_p=0.1, seed=-3, presence_penalty=1.5,
              frequency_penalty=-0.5)
    assert live.engine.submitted[-1].sampling == SamplingParams(
        temperature=0.0, top_p=0.8, top_k=5, min_p=0.1, presence_penalty=1.5,
        frequency_penalty=-0.5, seed=-3)
    assert live.engine.submitted[-1].protocol == "openai-chat"


def test_messages_reach_the_template_in_its_shape(live):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    call_json = {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}
    live.chat(tools=[tool], messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"id": "call_1", "type": "function", "function": call_json}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    call = live.engine.chat_template.calls[-1]
    assert call["tools"] == [tool]
    assert call["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "reasoning_content": "hmm",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]


def test_tool_choice_none_and_allowed_tools_filter_the_template_tools(live):
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    live.chat(tools=tools, tool_choice="none")
    assert live.engine.chat_template.calls[-1]["tools"] is None
    allowed = {"type": "allowed_tools",
               "allowed_tools": {"mode": "auto", "tools": [{"type": "function",
                                                            "function": {"name": "b"}}]}}
    live.chat(tools=tools, tool_choice=allowed)
    assert live.engine.chat_template.calls[-1]["tools"] == [tools[1]]


@pytest.mark.parametrize("fields, kwargs", [
    ({}, {}),
    ({"reasoning_effort": "high"}, {"reasoning_effort": "xhigh"}),
    ({"reasoning_effort": "minimal"}, {"reasoning_effort": "low"}),
    ({"reasoning_effort": "none"}, {"enable_thinking": False}),
    ({"enable_thinking": False, "chat_template_kwargs": {"enable_thinking": False, "x": 1}},
     {"enable_thinking": False, "x": 1}),
    ({"preserve_thinking": True}, {"preserve_thinking": True}),
])
def test_thinking_options_reach_the_template(live, fields, kwargs):
    assert live.chat(**fields).status == 200
    assert live.engine.chat_template.calls[-1]["kwargs"] == kwargs


def test_process_thinking_defaults_yield_to_the_request(serve):
    live = serve(no_thinking=True, preserve_thinking=True)
    live.chat()
    assert live.engine.chat_template.calls[-1]["kwargs"] == {
        "enable_thinking": False, "preserve_thinking": True}
    live.chat(chat_template_kwargs={"enable_thinking": True})
    assert live.engine.chat_template.calls[-1]["kwargs"]["enable_thinking"] is True


def test_admission_failure_is_a_plain_http_error_even_when_streaming(live):
    live.engine.script = Script(reject=EngineError("queue full", "server_overloaded", 429))
    for stream in (False, True):
        reply = live.chat(stream=stream)
        assert reply.status == 429
        assert not reply.headers["content-type"].startswith("text/event-stream")
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "server_overloaded")


def test_engine_error_in_non_stream_is_an_http_error(live):
    live.engine.script = Script(fail=EngineError("step loop broke", "service_unavailable", 503))
    reply = live.chat()
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "service_unavailable"


def test_mid_stream_error_is_in_band_without_done(live):
    live.engine.script = Script(pieces=("partial",),
                                fail=EngineError("engine failed", "service_unavailable", 503))
    reply = live.chat(stream=True)
    assert reply.status == 200
    events = sse_events(reply.body)
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert set(last) == {"error"}
    assert last["error"]["code"] == "service_unavailable"
    assert last["error"]["type"] == "server_error"
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == "partial"


def test_keep_alive_comment_during_silence(serve):
    live = serve(keepalive_s=0.05)
    live.engine.script = Script(pieces=("a", "b"), delay_s=0.3)
    events = sse_events(live.chat(stream=True).body)
    assert ": keep-alive" in events
    assert events[-1] == "[DONE]"


def test_engine_exception_becomes_internal_error(live):
    live.engine.script = Script(pieces=("partial",), crash=True)
    reply = live.chat()
    assert reply.status == 500
    assert reply.json()["error"]["code"] == "internal_error"
    events = sse_events(live.chat(stream=True).body)
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "internal_error"


def test_client_label_is_validated(live):
    ok = live.request("POST", "/v1/chat/completions",
                      {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
                      headers={"X-Ninfer-Client": "claude-code/1.0:main"})
    assert ok.status == 200
    for bad in ("has space", "x" * 65):
        reply = live.request("POST", "/v1/chat/completions", {}, headers={"X-Ninfer-Client": bad})
        assert reply.status == 400
        assert reply.json()["error"]["code"] == "invalid_client_label"


def test_ignore_eos_as_vllm_reaches_the_engine(live):
    """vLLM's `ignore_eos` (benchmarks: answers run to max_tokens, as the peers' load tools
    send it for llama-server), honoured by Chat as by Completions; off by default."""
    sdk(live).chat.completions.create(model="fake-model", max_tokens=4, extra_body={
        "ignore_eos": True}, messages=[{"role": "user", "content": "hi"}])
    sdk(live).chat.completions.create(model="fake-model", max_tokens=4,
                                      messages=[{"role": "user", "content": "hi"}])
    assert [r.ignore_eos for r in live.engine.submitted] == [True, False]
    reply = live.chat(ignore_eos="yes")
    assert reply.status == 400 and reply.json()["error"]["param"] == "ignore_eos"
