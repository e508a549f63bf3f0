"""Tool calls of the default model through the official SDKs on a real `ninfer-serve` (issue
21): a forced call cut by the token limit is text with finish `length` (Chat, Responses,
Messages), `strict` tools under `tool_choice: auto` (Chat, Messages) and a custom tool with a
Lark grammar (Responses) have their input held to the schema / grammar, Responses returns
`output_text.logprobs`, `/v1/completions` returns prompt log-probabilities, and the
`anthropic` SDK's `messages.parse` gets its structured output. The session's one server
(conftest.py); the many-seed runs are marked slow."""
from __future__ import annotations

import math
import re
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from server_process import MODEL_ID, NEEDS_MODEL

pytestmark = NEEDS_MODEL


class Weather(BaseModel, extra="forbid"):
    city: str = Field(max_length=30)
    unit: str = Field(pattern="^(c|f)$")


WEATHER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                  "properties": {"city": {"type": "string", "maxLength": 30},
                                 "unit": {"enum": ["c", "f"]}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city", "strict": True,
    "parameters": WEATHER_SCHEMA}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999}},
    "required": ["id"], "additionalProperties": False}}}
# The default model's template does not show tools; one example turn makes it call one
# unforced (greedy and many seeds). Left free, it then writes a unit outside the enum ("s").
SHOT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "London", "unit": "c"}}\n'
        "</tool_call>")
FEW_SHOT = [
    {"role": "system", "content": "To call a tool, write <tool_call>, a JSON object with name "
     "and arguments, and </tool_call>."},
    {"role": "user", "content": "What is the weather in London?"},
    {"role": "assistant", "content": SHOT},
    {"role": "user", "content": "What is the weather in Paris?"},
]
COMMAND = 'start: ("ls" | "cat") " " PATH\nPATH: /[a-z_.\\/]{1,20}/\n'
SHELL = {"type": "custom", "name": "shell", "description": "Run one command.",
         "format": {"type": "grammar", "syntax": "lark", "definition": COMMAND}}
USER = [{"role": "user", "content": "Look up customer 7."}]


def test_a_forced_call_cut_by_max_tokens_is_text_not_a_call(client, claude):
    forced = dict(tools=[LOOKUP], tool_choice="required", max_tokens=6, temperature=0)
    choice = client.chat.completions.create(model=MODEL_ID, messages=USER, **forced).choices[0]
    assert (choice.finish_reason, choice.message.tool_calls) == ("length", None)
    assert choice.message.content.startswith("<tool_call>")
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=USER, stream=True,
                                                 **forced))
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length"

    response = client.responses.create(
        model=MODEL_ID, input="Look up customer 7.", max_output_tokens=6, temperature=0,
        tools=[{"type": "function", **LOOKUP["function"]}], tool_choice="required")
    assert response.status == "incomplete"
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == choice.message.content

    with claude.messages.stream(  # this SDK's stream() has no `temperature`: same JSON
            model="any", max_tokens=6, messages=USER, extra_body={"temperature": 0},
            tools=[{"name": "lookup", "input_schema": LOOKUP["function"]["parameters"]}],
            tool_choice={"type": "any"}) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "max_tokens"
    assert [block.type for block in message.content] == ["text"]


def strict_call(client, **fields) -> tuple[str, list]:
    reply = client.chat.completions.create(model=MODEL_ID, messages=FEW_SHOT, tools=[WEATHER],
                                           max_tokens=48, **fields)
    return reply.choices[0].finish_reason, reply.choices[0].message.tool_calls or []


def test_strict_tools_under_auto_match_their_schema(client):
    finish, calls = strict_call(client, temperature=0)
    assert finish == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]
    assert Weather.model_validate_json(calls[0].function.arguments).city == "Paris"


@pytest.mark.slow
def test_anthropic_strict_tool_under_auto_matches_its_schema(claude):
    message = claude.messages.create(
        model="any", max_tokens=48, extra_body={"temperature": 0}, system=FEW_SHOT[0]["content"],
        messages=[{"role": m["role"], "content": m["content"]} for m in FEW_SHOT[1:]],
        tools=[{"name": "get_weather", "strict": True, "input_schema": WEATHER_SCHEMA}])
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    Weather.model_validate(call.input)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~6 s a run on the 2-core CPU
def test_strict_tool_calls_match_their_schema_for_40_seeds(client):
    made = 0
    for seed in range(40):
        _, calls = strict_call(client, temperature=1.0, seed=seed)
        for call in calls:
            assert call.function.name == "get_weather"
            Weather.model_validate_json(call.function.arguments)
        made += len(calls)
    assert made >= 5  # the example turn makes the model call; every call it made validated


def shell_call(client, **fields):
    return client.responses.create(
        model=MODEL_ID, input="Show me the README file.", tools=[SHELL],
        tool_choice={"type": "custom", "name": "shell"}, max_output_tokens=64, **fields)


def test_custom_tool_input_follows_its_lark_grammar(client):
    response = shell_call(client, temperature=0)
    [call] = response.output
    assert call.type == "custom_tool_call" and call.name == "shell"
    assert re.fullmatch(r"(ls|cat) [a-z_./]{1,20}", call.input), call.input


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_custom_tool_input_follows_its_grammar_in_10_sampled_runs(client):
    # Responses has no `seed`: ten unseeded runs at temperature 1
    for run in range(10):
        [call] = shell_call(client, temperature=1.0, top_p=1.0).output
        assert re.fullmatch(r"(ls|cat) [a-z_./]{1,20}", call.input), (run, call.input)


def test_responses_output_text_logprobs(client):
    response = client.responses.create(
        model=MODEL_ID, input="Name a colour.", max_output_tokens=6, temperature=0,
        top_logprobs=3, include=["message.output_text.logprobs"])
    [message] = response.output
    entries = message.content[0].logprobs
    assert len(entries) == response.usage.output_tokens - (response.status == "completed")
    assert "".join(e.token for e in entries) == response.output_text
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        # greedy takes the argmax, whose log-probability is the top alternative's
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-6)


def test_prompt_logprobs_match_the_sampler_and_vllm_form(client):
    """lm-eval-harness' loglikelihood request (`echo`, `logprobs`, `max_tokens: 0`) on a prompt
    extended by the greedy next token: the prompt's last entry is the value the sampler
    reported for that token, its top alternatives the sampler's; vLLM's `prompt_logprobs`
    gives the same values with ranks."""
    first = client.completions.create(model=MODEL_ID, prompt="The capital of France is",
                                      max_tokens=1, temperature=0, logprobs=3)
    lead = first.choices[0].logprobs
    scored = client.completions.create(
        model=MODEL_ID, prompt="The capital of France is" + first.choices[0].text, echo=True,
        logprobs=3, max_tokens=0, temperature=0, extra_body={"prompt_logprobs": 3})
    choice = scored.choices[0]
    assert choice.text == "The capital of France is" + first.choices[0].text
    assert scored.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == scored.usage.prompt_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(v <= 0 for v in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text
    assert math.isclose(logprobs.token_logprobs[-1], lead.token_logprobs[0], abs_tol=1e-3)
    assert logprobs.top_logprobs[-1].keys() == lead.top_logprobs[0].keys()
    vllm = choice.model_extra["prompt_logprobs"]
    assert vllm[0] is None and len(vllm) == len(logprobs.tokens)
    for entry, value in zip(vllm[1:], logprobs.token_logprobs[1:]):
        assert len(entry) in (3, 4)  # the top 3, and the prompt token when it is not among them
        assert min(e["rank"] for e in entry.values()) == 1
        assert value in [e["logprob"] for e in entry.values()]


class Sky(BaseModel):
    # Anthropic's SDK keeps only structural keywords (enums, types, required) in the schema it
    # sends, moving bounds and patterns into descriptions; a free string or integer would be
    # unbounded for the sampled 135M model
    unit: Literal["c", "f"]
    sky: Literal["clear", "cloudy", "rain"]
    windy: bool


def test_anthropic_messages_parse_gets_its_structured_output(claude):
    """`messages.parse(output_format=...)` sends `output_config.format` (json_schema); the
    answer's text follows the schema and the SDK parses it, sampled at temperature 1."""
    for _ in range(3):
        message = claude.messages.parse(
            model=MODEL_ID, max_tokens=120, output_format=Sky,
            extra_body={"temperature": 1.0},  # this SDK method has no temperature parameter
            messages=[{"role": "user", "content": "The weather in Paris, as JSON."}])
        assert message.stop_reason == "end_turn", message.content
        assert isinstance(message.parsed_output, Sky)
