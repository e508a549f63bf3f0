"""Seeded request bodies for fuzzing a live server: plausible settings combined at random (the
engine's paths: grammars, tools, penalties, log-probabilities, n > 1, thinking) and bodies
mutated at random (wrong types, missing or unknown fields: the protocols' error paths).

`bodies(rng, model, n)` yields (path, body). A server passes when no answer is a 5xx, no stream
carries an in-band error, and the engine is still ready afterwards (tests/serve/test_fuzz_serve.py).
Fuzzing of this kind found `max_tokens` 0 with a short prompt failing the CPU engine, `top_p` 0
drawing a masked token, and Qwen's tool-call tags refused by their own grammar; with any of
those fixes undone, test_fuzz_serve.py fails at its seeds."""
from __future__ import annotations

import copy
import random
from typing import Any, Iterator

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
CHAT = {
    "stream": [True, False], "n": [1, 2, 3], "stop": ["\n", ["a", "the"], [], ["x"] * 4],
    "temperature": [0, 0.7, 2.0], "top_p": [0.0, 0.1, 1.0], "top_k": [0, 1, 5, -1],
    "min_p": [0.0, 0.5, 1.0], "seed": [0, 2**31, 2**63 - 1, -1], "logprobs": [True, False],
    "top_logprobs": [0, 5, 20], "presence_penalty": [-2, 2], "frequency_penalty": [-2, 2],
    "repetition_penalty": [0.5, 1.3], "logit_bias": [{"1": 100}, {"50": 5, "60": -5}, {}],
    "response_format": [{"type": "json_object"}, {"type": "text"},
                        {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}],
    "tools": [[CHAT_TOOL], []],
    "tool_choice": ["auto", "none", "required",
                    {"type": "function", "function": {"name": "get_weather"}}],
    "stream_options": [{"include_usage": True}], "max_tokens": [0, 1, 8, 24],
    "parallel_tool_calls": [True, False], "prompt_logprobs": [0, 3], "echo": [True],
    "chat_template_kwargs": [{"enable_thinking": False}] * 3 + [{}], "reasoning_effort": ["low"],
}
CHAT_MESSAGES = [
    [{"role": "user", "content": "Say hi"}],
    [{"role": "system", "content": "JSON only"}, {"role": "user", "content": "name and n"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": None, "tool_calls": [{
         "id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    [{"role": "developer", "content": "be short"}, {"role": "user", "content": "x" * 3000}],
    [{"role": "user", "content": "é漢字🙂\u200b"}],
]
RESPONSES = {
    "stream": [True, False], "temperature": [0, 1], "max_output_tokens": [1, 8, 20],
    "instructions": ["be brief", ""], "store": [True, False], "top_logprobs": [0, 3],
    "text": [{"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}},
             {"format": {"type": "json_object"}}],
    "tools": [[{"type": "function", "name": "get_weather", "parameters": PARAMETERS}]],
    "tool_choice": ["auto", "required", "none"], "truncation": ["auto", "disabled"],
}
MESSAGES = {
    "stream": [True, False], "temperature": [0, 1], "top_k": [1, 10], "stop_sequences": [["\n"]],
    "system": ["be brief", [{"type": "text", "text": "sys"}]],
    "tools": [[{"name": "get_weather", "input_schema": PARAMETERS}]],
    "tool_choice": [{"type": "auto"}, {"type": "any"}, {"type": "none"},
                    {"type": "tool", "name": "get_weather"}],
    "thinking": [{"type": "enabled", "budget_tokens": 1024}] + [{"type": "disabled"}] * 3,
    "output_format": [{"type": "json_schema", "schema": SCHEMA}],
}
ODD = [None, 0, -1, 1.5, 1e308, 2**63, "", "abc", "\u0000", [], [None], {}, {"a": 1}, True,
       "x" * 5000, {"type": "text"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
KEYS = ["stream", "n", "stop", "temperature", "top_p", "top_k", "seed", "logprobs", "tools",
        "tool_choice", "response_format", "max_tokens", "messages", "input", "model", "content",
        "role", "type", "text", "system", "thinking", "metadata", "json_schema", "schema"]


def _pick(rng: random.Random, options: dict[str, list]) -> dict[str, Any]:
    return {k: copy.deepcopy(rng.choice(v)) for k, v in options.items() if rng.random() < 0.35}


def plausible(rng: random.Random, model: str) -> tuple[str, dict[str, Any]]:
    """A request every field of which is valid alone (their combination may not be); a tool
    choice mostly comes with the tools it names."""
    path, body = _plausible(rng, model)
    if "tool_choice" in body and "tools" not in body and rng.random() < 0.8:
        body["tools"] = copy.deepcopy({"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES,
                                       "/v1/messages": MESSAGES}[path]["tools"][0])
    return path, body


def _plausible(rng: random.Random, model: str) -> tuple[str, dict[str, Any]]:
    roll = rng.random()
    if roll < 0.45:
        return "/v1/chat/completions", {"model": model, "max_tokens": 8,
                                        "messages": copy.deepcopy(rng.choice(CHAT_MESSAGES)),
                                        **_pick(rng, CHAT)}
    if roll < 0.65:
        return "/v1/responses", {"model": model, "input": rng.choice(["hi", [
            {"role": "user", "content": "hi"}]]), "max_output_tokens": 8,
            **_pick(rng, RESPONSES)}
    if roll < 0.9:
        body = {"model": "claude-x", "max_tokens": 8, "messages": rng.choice([
            [{"role": "user", "content": "hi"}],
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "{"}]]),
            **_pick(rng, MESSAGES)}
        if body.get("thinking", {}).get("type") == "enabled":
            body["max_tokens"] = 1100  # the budget (1024, the least allowed) and an answer
        return "/v1/messages", body
    return "/v1/completions", {"model": model, "prompt": rng.choice(["Once", ["a", "b"], [1, 2]]),
                               "max_tokens": rng.choice([0, 4]),
                               **_pick(rng, {"echo": [True, False], "logprobs": [0, 2],
                                             "stream": [True, False], "n": [1, 2]})}


def _paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(
        obj, list) else ()
    for key, value in items:
        yield from _paths(value, prefix + (key,))


def mutated(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with one to three places replaced by an odd value, removed, or given an extra
    field or item."""
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([p for p in _paths(body) if p])
        *parents, last = path
        holder = body
        for key in parents:
            holder = holder[key]
        roll = rng.random()
        if roll < 0.5:
            holder[last] = copy.deepcopy(rng.choice(ODD))
        elif roll < 0.7:
            del holder[last]
        elif isinstance(holder[last], dict):
            holder[last][rng.choice(KEYS)] = copy.deepcopy(rng.choice(ODD))
        elif isinstance(holder[last], list):
            holder[last].append(copy.deepcopy(rng.choice(ODD)))
    return body


def bodies(rng: random.Random, model: str, n: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """`n` requests, a third of them mutated; outputs stay short (max tokens at most 24,
    a thinking budget's 1,100 aside)."""
    for _ in range(n):
        path, body = plausible(rng, model)
        if rng.random() < 1 / 3:
            body = mutated(rng, body)
            key = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
            cap = body.get(key)  # a mutation may drop it or make it huge: keep odd values
            if cap is None or isinstance(cap, (int, float)) and cap > 24:
                body[key] = 8
        yield path, body
