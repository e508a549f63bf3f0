"""Anthropic Messages (§7) through the official `anthropic` SDK and raw HTTP."""
from __future__ import annotations

import base64
import json
import re

import anthropic
import pytest

from fake_engine import FAKE_CONFIG, FakeEngine, Script
from ninfer_engine.types import EngineError
from ninfer_http.anthropic_messages import parse_messages_request

USER = [{"role": "user", "content": "Hi"}]


def sdk(live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=10)


def messages(live, **fields):
    body = {"model": "claude-any", "max_tokens": 100, "messages": USER}
    body.update(fields)
    return live.request("POST", "/v1/messages", body)


def events(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("event: "):
            name, data = block.split("\n", 1)
            out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_sdk_non_stream(live):
    live.engine.script = Script(cached_tokens=4)
    message = sdk(live).messages.create(model="claude-any", max_tokens=100, messages=USER)
    assert re.fullmatch(r"msg_[0-9a-f]{16}", message.id)
    assert message.model == "claude-any"
    assert message.role == "assistant"
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello, world!")]
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    prompt = len(live.engine.submitted[-1].prompt_ids)
    assert message.usage.input_tokens == prompt - 4
    assert message.usage.cache_read_input_tokens == 4
    assert message.usage.cache_creation_input_tokens is None
    assert message.usage.output_tokens == 4
    assert live.engine.submitted[-1].protocol == "anthropic"
    assert live.engine.submitted[-1].max_tokens == 100


def test_sdk_stream_event_order(live):
    with sdk(live).messages.stream(model="claude-any", max_tokens=100, messages=USER) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == "Hello, world!"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 4
    raw = [k for k in kinds if k not in ("text",)]
    assert raw[0] == "message_start"
    assert raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_raw_stream_and_request_id(live):
    reply = messages(live, stream=True)
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert re.fullmatch(r"req_[0-9a-f]{16}", reply.headers["request-id"])
    names = [name for name, _ in events(reply.body)]
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * 4 + [
        "content_block_stop", "message_delta", "message_stop"]
    start = events(reply.body)[0][1]["message"]
    assert start["usage"]["output_tokens"] == 0 and start["content"] == []


@pytest.mark.parametrize("script, reason, sequence", [
    (Script(stop_sequence="END"), "stop_sequence", "END"),
    (Script(finish="length", pieces=("a",) * 100), "max_tokens", None),
    (Script(finish="length", pieces=("a",) * 3), "model_context_window_exceeded", None),
])
def test_stop_reasons(live, script, reason, sequence):
    live.engine.script = script
    body = messages(live, stop_sequences=["END"]).json()
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)
    assert live.engine.submitted[-1].stop == ("END",)


def test_count_tokens_matches_the_prompt(live):
    counted = sdk(live).messages.count_tokens(model="claude-any", messages=USER, system="Be kind")
    messages(live, system="Be kind")
    assert counted.input_tokens == len(live.engine.submitted[-1].prompt_ids)


def test_count_tokens_takes_a_thinking_budget_above_the_default_output_limit(live):
    # Claude Code counts with `thinking.budget_tokens` 31999 and no max_tokens (the count_tokens
    # body has none); /v1/messages itself still holds the budget against max_tokens.
    thinking = {"type": "enabled", "budget_tokens": 31999}
    counted = live.request("POST", "/v1/messages/count_tokens",
                           {"model": "claude-any", "messages": USER, "thinking": thinking})
    assert counted.status == 200, counted.body
    assert messages(live, max_tokens=None, thinking=thinking).status == 400


def test_system_blocks_billing_header_and_history_shapes(live):
    signature = "ninfer-reasoning.v1:" + base64.b64encode(b"hidden thought").decode()
    messages(live, system=[{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                           {"type": "text", "text": "You are terse."}],
             tools=[{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
             messages=[
                 {"role": "user", "content": "list files"},
                 {"role": "assistant", "content": [
                     {"type": "thinking", "thinking": "", "signature": signature},
                     {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": "."}}]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                     {"type": "text", "text": "thanks"}]},
             ])
    call = live.engine.chat_template.calls[-1]
    assert call["tools"] == [{"type": "function", "function": {
        "name": "ls", "parameters": {"type": "object"}, "description": "list"}}]
    assert call["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "reasoning_content": "hidden thought",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "ls", "arguments": {"dir": "."}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
        {"role": "user", "content": "thanks"},
    ]


def test_assistant_prefill_is_continued(live):
    reply = messages(live, messages=USER + [{"role": "assistant", "content": "Sure:"}])
    assert reply.status == 200
    prompt = live.engine.tokenizer.decode(live.engine.submitted[-1].prompt_ids)
    assert prompt.endswith("<assistant>Sure:")
    assert live.engine.chat_template.calls[-1]["kwargs"]["enable_thinking"] is False
    assert reply.json()["content"][0]["text"] == "Hello, world!"
    conflict = messages(live, thinking={"type": "adaptive"},
                        messages=USER + [{"role": "assistant", "content": "Sure:"}])
    assert conflict.status == 400


def test_thinking_and_effort_reach_the_template(live):
    messages(live, thinking={"type": "disabled"})
    assert live.engine.chat_template.calls[-1]["kwargs"] == {"enable_thinking": False}
    messages(live, max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 2048},
             output_config={"effort": "high"})
    assert live.engine.chat_template.calls[-1]["kwargs"] == {
        "enable_thinking": True, "reasoning_effort": "xhigh"}


@pytest.mark.parametrize("fields", [
    {"max_tokens": 0},
    {"messages": []},
    {"thinking": {"type": "enabled", "budget_tokens": 512}},
    {"thinking": {"type": "enabled", "budget_tokens": 4096}},
    {"tool_choice": {"type": "any"}},  # no tool to call
    {"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}},
    {"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool"}},
    {"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
    {"tool_choice": {"type": "required"}},
    {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    {"tools": [{"name": "f", "input_schema": {}, "strict": "yes"}]},
    {"tools": [{"name": "f", "input_schema": {"type": "x"}, "strict": True}]},  # no grammar
    {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
    {"mcp_servers": [{"type": "url", "url": "https://example.com", "name": "m"}]},
    {"temperature": 5},
    {"output_config": {"format": {"type": "json_schema"}}},  # no schema
    {"output_format": {"type": "json_object", "schema": {}}},
    {"output_config": {"format": {"type": "json_schema", "schema": {"type": "x"}}}},
    {"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"},
     "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
])
def test_invalid_requests_are_400_in_anthropic_shape(live, fields):
    reply = messages(live, **fields)
    assert reply.status == 400, reply.body
    body = reply.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["request_id"] == reply.headers["request-id"]
    assert live.engine.submitted == []


SCHEMA = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"],
          "additionalProperties": False}


def test_sdk_raises_on_anthropic_errors(serve):
    live = serve(api_key="k")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=live.url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=10, messages=USER)
    ok = anthropic.Anthropic(base_url=live.url, api_key="k", max_retries=0).messages.create(
        model="m", max_tokens=10, messages=USER)
    assert ok.content[0].text == "Hello, world!"


@pytest.mark.parametrize("error, status, kind", [
    (EngineError("busy", "server_overloaded", 429), 529, "overloaded_error"),
    (EngineError("waited", "request_queue_timeout", 503), 504, "timeout_error"),
    (EngineError("down", "service_unavailable", 503), 503, "api_error"),
])
def test_admission_errors_map_to_anthropic_statuses(live, error, status, kind):
    live.engine.script = Script(reject=error)
    for stream in (False, True):
        reply = messages(live, stream=stream)
        assert reply.status == status
        assert reply.json()["error"]["type"] == kind


def test_mid_stream_error_event(live):
    live.engine.script = Script(pieces=("part",), fail=EngineError("boom", "internal_error", 500))
    names = events(messages(live, stream=True).body)
    assert [n for n, _ in names][0] == "message_start"
    name, data = names[-1]
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert "message_stop" not in [n for n, _ in names]


def test_beta_query_is_ignored(live):
    assert live.request("POST", "/v1/messages?beta=true",
                        {"model": "m", "max_tokens": 5, "messages": USER}).status == 200


def test_top_k_has_no_upper_cap(live):
    # the Anthropic API bounds top_k below only; OpenAI paths keep the manual page's 0..20
    assert messages(live, top_k=250).status == 200
    assert live.engine.submitted[-1].sampling.top_k == 250
    assert messages(live, top_k=-1).status == 400
    assert live.chat(top_k=21).status == 400


TOOLS = [{"name": "Glob", "input_schema": {"type": "object", "properties": {
             "pattern": {"type": "string"}}, "required": ["pattern"]}},
         {"name": "Read", "input_schema": {"type": "object", "properties": {
             "file_path": {"type": "string"}}, "required": ["file_path"]}}]


def parsed(**fields):
    body = {"model": "claude-any", "max_tokens": 100, "messages": USER, "tools": TOOLS, **fields}
    chat, _, _ = parse_messages_request(json.dumps(body).encode(), FakeEngine(), FAKE_CONFIG)
    return chat


@pytest.mark.parametrize("choice, names, parallel", [
    ({"type": "any"}, {"Glob", "Read"}, True),
    ({"type": "tool", "name": "Read"}, {"Read"}, True),
    ({"type": "any", "disable_parallel_tool_use": True}, {"Glob", "Read"}, False),
])
def test_forced_tool_choice_becomes_the_call_grammar(choice, names, parallel):
    chat = parsed(tool_choice=choice)
    assert chat.grammar is not None and chat.grammar_param == "tool_choice"
    # the grammar's call schema names exactly the tools the choice allows
    assert set(re.findall(r'"const": "(\w+)"', chat.grammar)) == names
    assert chat.parallel_tool_calls is parallel
    # the repeat separator between calls is there only when several calls may come back
    assert ("call (" in chat.grammar) is parallel


def test_auto_and_none_tool_choice_force_nothing():
    auto = parsed(tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert auto.grammar is None and auto.parallel_tool_calls is False
    assert [t["function"]["name"] for t in auto.tools] == ["Glob", "Read"]
    none = parsed(tool_choice={"type": "none"})
    assert none.grammar is None and none.tools is None


def test_forced_tool_choice_reaches_the_engine_as_a_constraint(live):
    # the scripted engine's character tokenizer cannot drive llguidance: the request gets as
    # far as compiling the grammar and is refused there, not answered unconstrained
    reply = messages(live, tools=TOOLS, tool_choice={"type": "tool", "name": "Glob"})
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["message"].startswith("Constrained output is not available")
    assert live.engine.submitted == []


@pytest.mark.parametrize("fields, param", [
    ({"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
     "output_config.format"),
    ({"output_format": {"type": "json_schema", "schema": SCHEMA}}, "output_format"),  # beta
])
def test_structured_output_becomes_the_answer_grammar(fields, param):
    chat = parsed(**fields)
    flat = chat.grammar.replace(" ", "").replace("\\", "")
    assert chat.grammar_param == param and '"enum":["a","b"]' in flat
    # beside a strict tool: free text is replaced by the format, calls keep their schema
    tools = [{"name": "f", "input_schema": SCHEMA, "strict": True}]
    both = parsed(tools=tools, **fields)
    assert both.grammar_param == "tools" and "<tool_call>" in both.grammar


def test_structured_output_reaches_the_engine_as_a_constraint(live):
    reply = messages(live, output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    assert reply.status == 400, reply.body  # compiled, refused by the scripted tokenizer
    error = reply.json()["error"]
    assert error["message"].startswith("Constrained output is not available")
    assert live.engine.submitted == []
