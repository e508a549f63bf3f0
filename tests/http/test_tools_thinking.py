"""Reasoning and tool calls end to end: scripted engine text -> live server -> official SDKs.

The scripted output splits `</think>` and `<tool_call>` across pieces on purpose; the template
below opens `<think>` like Qwen's when thinking is on and renders tool history, so a round trip
can be checked in the prompt the engine receives.
"""
from __future__ import annotations

import base64
import json
import re

import anthropic
import openai
import pytest

from fake_engine import FakeEngine, RecordingTemplate, Script

PIECES = (
    "Let me", " look.\n</th", "ink>\n\nI'll check", " the weather.\n<tool",
    '_call>\n{"name": "get_weather", "argu',
    'ments": {"city": "Paris", "days": "3"}}\n</tool_call>',
    "\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n",
    "</tool_call>",
)
# Tokens that arrived while the output was in reasoning: "Let me", " look.\n</th", "ink>…".
REASONING_TOKENS = 3
REASONING = "Let me look."
TEXT = "I'll check the weather."
CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "days": {"type": "integer"}}}
TIME_SCHEMA = {"type": "object", "properties": {"zone": {"type": "string"}}}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_SCHEMA}},
]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER_SCHEMA},
                   {"name": "get_time", "input_schema": TIME_SCHEMA}]
USER = [{"role": "user", "content": "Weather in Paris?"}]
THINKING_ON = {"chat_template_kwargs": {"enable_thinking": True}}
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<function", "<parameter")


class QwenLikeTemplate(RecordingTemplate):
    """Renders tool calls and results, and opens `<think>` when thinking is on."""

    def render(self, messages, tools=None, add_generation_prompt=True, **template_kwargs) -> str:
        super().render(messages, tools, add_generation_prompt, **template_kwargs)
        out = []
        for m in messages:
            text = m["content"]
            if m.get("reasoning_content"):
                text = f"<think>{m['reasoning_content']}</think>{text}"
            for call in m.get("tool_calls") or []:
                function = call["function"]
                text += "<tool_call>" + json.dumps({"name": function["name"],
                                                    "arguments": function["arguments"]})
                text += "</tool_call>"
            if m["role"] == "tool":
                text = f"<tool_response>{text}</tool_response>"
            out.append(f"<{m['role']}>{text}\n")
        thinking = "<think>\n" if template_kwargs.get("enable_thinking") else ""
        return "".join(out) + "<assistant>" + thinking


@pytest.fixture
def live(serve):
    engine = FakeEngine(Script(pieces=PIECES))
    engine.chat_template = QwenLikeTemplate()
    engine.max_context = 4096
    return serve(engine)


def prompt_text(live) -> str:
    return live.engine.tokenizer.decode(live.engine.submitted[-1].prompt_ids)


def openai_sdk(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def anthropic_sdk(live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=10)


def test_chat_non_stream(live):
    completion = openai_sdk(live).chat.completions.create(
        model="fake-model", messages=USER, tools=OPENAI_TOOLS, extra_body=THINKING_ON)
    choice = completion.choices[0]
    assert prompt_text(live).endswith("<assistant><think>\n")
    assert choice.message.reasoning_content == REASONING
    assert choice.message.content == TEXT
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == CALLS
    assert all(re.fullmatch(r"call_[0-9a-f]{16}", c.id) and c.type == "function" for c in calls)
    assert len({c.id for c in calls}) == 2
    assert completion.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    assert completion.usage.completion_tokens == len(PIECES)


def test_chat_stream_order_and_round_trip(live):
    client = openai_sdk(live)
    chunks = list(client.chat.completions.create(
        model="fake-model", messages=USER, tools=OPENAI_TOOLS, extra_body=THINKING_ON,
        stream=True, stream_options={"include_usage": True}))
    kinds = []
    for chunk in chunks[:-1]:
        delta = chunk.choices[0].delta
        kind = ("role" if delta.role else "reasoning" if getattr(delta, "reasoning_content", None)
                else "tool_calls" if delta.tool_calls else "content" if delta.content
                else "finish" if chunk.choices[0].finish_reason else "?")
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    assert kinds == ["role", "reasoning", "content", "tool_calls", "finish"]
    deltas = [c.choices[0].delta for c in chunks[:-1]]
    assert "".join(d.reasoning_content or "" for d in deltas
                   if getattr(d, "reasoning_content", None)) == REASONING
    content = "".join(d.content or "" for d in deltas)
    assert content == TEXT and not any(tag in content for tag in MARKUP)
    [call_chunk] = [d for d in deltas if d.tool_calls]
    calls = call_chunk.tool_calls
    assert [c.index for c in calls] == [0, 1]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == CALLS
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS

    # The client runs the tools and sends the results back; the next prompt renders them.
    live.engine.script = Script(pieces=("It is sunny.",))
    history = USER + [
        {"role": "assistant", "content": content, "reasoning_content": REASONING,
         "tool_calls": [{"id": c.id, "type": "function",
                         "function": {"name": c.function.name,
                                      "arguments": c.function.arguments}} for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "12:00"},
    ]
    answer = client.chat.completions.create(model="fake-model", messages=history,
                                            tools=OPENAI_TOOLS)
    assert answer.choices[0].message.content == "It is sunny."
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.tool_calls is None
    prompt = prompt_text(live)
    assert ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
            '</tool_call>') in prompt
    assert "<tool><tool_response>sunny</tool_response>" in prompt
    assert "<tool_response>12:00</tool_response>" in prompt
    assert f"<think>{REASONING}</think>" in prompt


def test_chat_stream_helper_accumulates_the_calls(live):
    with openai_sdk(live).chat.completions.stream(
            model="fake-model", messages=USER, tools=OPENAI_TOOLS,
            extra_body=THINKING_ON) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == TEXT
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in message.tool_calls] == CALLS


def test_chat_only_calls_gives_null_content_and_length_wins(live):
    live.engine.script = Script(pieces=("<tool", *PIECES[4:]), finish="length")
    completion = openai_sdk(live).chat.completions.create(
        model="fake-model", messages=USER, tools=OPENAI_TOOLS)
    choice = completion.choices[0]
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 2
    assert choice.finish_reason == "length"


def test_chat_without_tools_keeps_markup_as_content(live):
    live.engine.script = Script(pieces=PIECES[3:6])
    reply = live.chat(max_tokens=100)
    message = reply.json()["choices"][0]["message"]
    assert message["content"].startswith(" the weather.\n<tool_call>\n{")
    assert "tool_calls" not in message
    assert reply.json()["choices"][0]["finish_reason"] == "stop"


def test_chat_malformed_call_is_content(live):
    live.engine.script = Script(pieces=("Try:", " <tool_", "call>{oops}", "</tool_call>"))
    reply = live.chat(tools=OPENAI_TOOLS, stream=True)
    text = reply.body.decode()
    chunks = [json.loads(line[6:]) for line in text.split("\n")
              if line.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == "Try: <tool_call>{oops}</tool_call>"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("tool_calls" in c["choices"][0]["delta"] for c in chunks)


def test_output_that_opens_think_itself(live):
    # Tag tokens as a Qwen tokenizer emits them; "</think>" counts as reasoning, "<think>" not.
    live.engine.script = Script(pieces=("<think>", "\nhm", "m", "</think>", "\n\nHi"))
    body = live.chat().json()
    assert not prompt_text(live).endswith("<think>\n")
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("hmm", "Hi")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3


def anthropic_create(**fields):
    params = dict(model="claude-any", max_tokens=2048, messages=USER, tools=ANTHROPIC_TOOLS,
                  thinking={"type": "enabled", "budget_tokens": 1024})
    params.update(fields)
    return params


def test_anthropic_non_stream(live):
    message = anthropic_sdk(live).messages.create(**anthropic_create())
    assert prompt_text(live).endswith("<assistant><think>\n")
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, *calls = message.content
    assert (thinking.thinking, thinking.signature) == (REASONING, message.id)
    assert text.text == TEXT
    assert [(c.name, c.input) for c in calls] == CALLS
    assert all(re.fullmatch(r"toolu_[0-9a-f]{16}", c.id) for c in calls)
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens == len(PIECES)
    assert message.usage.output_tokens_details.thinking_tokens == REASONING_TOKENS


def test_anthropic_stream_through_the_sdk(live):
    with anthropic_sdk(live).messages.stream(**anthropic_create()) as stream:
        streamed = "".join(e.delta.text for e in stream
                           if e.type == "content_block_delta" and e.delta.type == "text_delta")
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert (final.content[0].thinking, final.content[0].signature) == (REASONING, final.id)
    assert final.content[1].text == streamed == TEXT
    assert [(c.name, c.input) for c in final.content[2:]] == CALLS
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens_details.thinking_tokens == REASONING_TOKENS


def sse_events(body: bytes) -> list[dict]:
    return [json.loads(block.split("\ndata: ", 1)[1])
            for block in body.decode().split("\n\n") if block.startswith("event: ")]


def test_anthropic_raw_event_sequence(live):
    body = anthropic_create()
    body["stream"] = True
    events = sse_events(live.request("POST", "/v1/messages", body).body)
    shape = []
    for e in events:
        part = e.get("content_block") or e.get("delta") or {}
        shape.append(f"{e['type']}:{part.get('type', '')}" if "index" in e else e["type"])
    thinking_deltas = shape.count("content_block_delta:thinking_delta")
    text_deltas = shape.count("content_block_delta:text_delta")
    tool = ["content_block_start:tool_use", "content_block_delta:input_json_delta",
            "content_block_stop:"]
    assert shape == (["message_start", "content_block_start:thinking"]
                     + ["content_block_delta:thinking_delta"] * thinking_deltas
                     + ["content_block_delta:signature_delta", "content_block_stop:",
                        "content_block_start:text"]
                     + ["content_block_delta:text_delta"] * text_deltas
                     + ["content_block_stop:"] + tool + tool + ["message_delta", "message_stop"])
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2, 3]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [(s["name"], s["input"]) for s in starts[2:]] == [(n, {}) for n, _ in CALLS]
    inputs = [json.loads(e["delta"]["partial_json"]) for e in events
              if e.get("delta", {}).get("type") == "input_json_delta"]
    assert inputs == [args for _, args in CALLS]
    texts = "".join(e["delta"].get("text", "") for e in events if "delta" in e and "index" in e)
    assert texts == TEXT and not any(tag in texts for tag in MARKUP)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_anthropic_omitted_thinking_round_trip(live):
    client = anthropic_sdk(live)
    params = anthropic_create(thinking={"type": "enabled", "budget_tokens": 1024,
                                              "display": "omitted"})
    message = client.messages.create(**params)
    thinking = message.content[0]
    assert thinking.thinking == ""
    prefix = "ninfer-reasoning.v1:"
    assert thinking.signature.startswith(prefix)
    assert base64.b64decode(thinking.signature[len(prefix):]).decode() == REASONING
    with client.messages.stream(**params) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" not in kinds and kinds.count("signature_delta") == 1
    assert final.content[0].signature == thinking.signature

    # Sending the turn back with tool results restores the thinking and renders the results.
    live.engine.script = Script(pieces=("Got it.", "</think>", "Sunny."))
    calls = message.content[2:]
    reply = client.messages.create(**dict(params, messages=USER + [
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"},
            {"type": "tool_result", "tool_use_id": calls[1].id, "content": "12:00"},
            {"type": "text", "text": "Thanks"}]},
    ]))
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert reply.content[0].signature == "ninfer-reasoning.v1:" + base64.b64encode(
        b"Got it.").decode()
    assert reply.content[1].text == "Sunny." and reply.stop_reason == "end_turn"
    prompt = prompt_text(live)
    assert f"<think>{REASONING}</think>{TEXT}<tool_call>" in prompt
    assert ('"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>\n'
            "<tool><tool_response>sunny</tool_response>\n"
            "<tool><tool_response>12:00</tool_response>\n<user>Thanks\n") in prompt


# Issue 21: a forced call's argument string held the end tag; pieces split inside both tags.
TAG_IN_STRING = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "}}}</tool',
                 '_call> x", "days": 2}}\n</tool', "_call>")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_call_with_the_end_tag_in_an_argument_string(live, stream):
    live.engine.script = Script(pieces=TAG_IN_STRING)
    client = openai_sdk(live)
    if stream:
        chunks = list(client.chat.completions.create(
            model="fake-model", messages=USER, tools=OPENAI_TOOLS, stream=True))
        assert not "".join(c.choices[0].delta.content or "" for c in chunks)
        [calls] = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(
            model="fake-model", messages=USER, tools=OPENAI_TOOLS).choices[0]
        assert choice.message.content is None
        calls, finish = choice.message.tool_calls, choice.finish_reason
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "}}}</tool_call> x", "days": 2})]
    assert finish == "tool_calls"


# Output cut at the token limit inside a call: the parsed body of the cut call would be a valid
# call (its JSON closed), but the model never closed the call, so no protocol presents it as one.
CUT = ("I'll check.", "\n<tool_call>\n", '{"name": "get_weather", ',
       '"arguments": {"city": "Paris"}}')
CUT_TEXT = "I'll check.\n<tool_call>\n" + "".join(CUT[2:])


@pytest.mark.parametrize("stream", [False, True])
def test_chat_call_cut_by_the_token_limit_is_not_a_call(live, stream):
    live.engine.script = Script(pieces=CUT, finish="length")
    client = openai_sdk(live)
    if stream:
        chunks = list(client.chat.completions.create(
            model="fake-model", messages=USER, tools=OPENAI_TOOLS, stream=True))
        assert not any(c.choices[0].delta.tool_calls for c in chunks)
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(
            model="fake-model", messages=USER, tools=OPENAI_TOOLS).choices[0]
        assert choice.message.tool_calls is None
        content, finish = choice.message.content, choice.finish_reason
    assert (content, finish) == (CUT_TEXT, "length")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_call_cut_by_the_token_limit_is_not_a_call(live, stream):
    live.engine.script = Script(pieces=CUT, finish="length")
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}]
    client = openai_sdk(live)
    if stream:
        # the SDK's stream helper only finalises a `response.completed`: read the events
        events = list(client.responses.create(model="fake-model", input="Weather?",
                                              tools=tools, stream=True))
        assert not any("function_call" in e.type for e in events)
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    else:
        response = client.responses.create(model="fake-model", input="Weather?", tools=tools)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == CUT_TEXT


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_call_cut_by_the_token_limit_is_not_a_call(live, stream):
    live.engine.script = Script(pieces=CUT, finish="length")
    client = anthropic_sdk(live)
    params = dict(model="claude-any", max_tokens=len(CUT), messages=USER, tools=ANTHROPIC_TOOLS)
    if stream:
        with client.messages.stream(**params) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**params)
    assert [(b.type, b.text) for b in message.content] == [("text", CUT_TEXT)]
    assert message.stop_reason == "max_tokens"


def test_a_strict_schema_that_cannot_be_enforced_is_400_in_each_shape(live):
    bad = {"type": "x"}
    with pytest.raises(openai.BadRequestError) as raised:
        openai_sdk(live).chat.completions.create(
            model="fake-model", messages=USER, tools=[{"type": "function", "function": {
                "name": "f", "strict": True, "parameters": bad}}])
    assert (raised.value.body["code"], raised.value.body["param"]) == ("invalid_value", "tools")
    with pytest.raises(anthropic.BadRequestError) as refused:
        anthropic_sdk(live).messages.create(
            model="claude-any", max_tokens=16, messages=USER,
            tools=[{"name": "f", "strict": True, "input_schema": bad}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "Cannot constrain these tools' calls" in refused.value.body["error"]["message"]
    assert live.engine.submitted == []
