"""Constrained output on a model with Qwen's tokenizer, through the real `ninfer-serve --no-tui`
serving a tiny synthetic artifact (random weights, the real Qwen3.5 tokenizer and template).

Qwen's tokenizer holds `<tool_call>` and `</tool_call>` as single added tokens. A grammar that
spelled the tags as text got a mask allowing only the `<tool_call>` token, which llguidance's
matcher then refused: every forced call failed with 500 "the output left its grammar" (found by
fuzzing the server). And a thinking request whose budget ran out was forced to close with
`</think>` and a blank line, the blank line fed to the answer's grammar, which refused it."""
from __future__ import annotations

import json

from server_process import MODEL_ID

from ninfer_engine.artifact.synth import write_synthetic

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "input_schema": WEATHER}]


def _post(server, path: str, body: dict) -> dict:
    status, _, raw = server.request("POST", path, body, timeout=120)
    assert status == 200, raw[-600:]
    return json.loads(raw)


def test_forced_calls_and_a_format_after_thinking_on_qwens_tokenizer(launch, tmp_path):
    model = write_synthetic("tiny-dense", tmp_path / "tiny.ninfer")
    server = launch("--model-id", MODEL_ID, "--default-thinking-budget", "12",
                    model=model).wait_ready()
    question = [{"role": "user", "content": "Weather in Paris?"}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        choice = {**choice, "disable_parallel_tool_use": True}  # (random weights: one call)
        body = _post(server, "/v1/messages", {
            "model": "m", "max_tokens": 96, "temperature": 0, "messages": question,
            "thinking": {"type": "disabled"}, "tools": TOOLS, "tool_choice": choice})
        calls = [block for block in body["content"] if block["type"] == "tool_use"]
        assert body["stop_reason"] == "tool_use" and len(calls) == 1, body
        assert calls[0]["name"] == "get_weather" and set(calls[0]["input"]) == {"city"}

    # thinking on (the template's default): 12 tokens of it, then the forced close, then JSON
    body = _post(server, "/v1/chat/completions", {
        "model": MODEL_ID, "max_tokens": 96, "temperature": 0, "messages": question,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "w", "schema": WEATHER}}})
    choice = body["choices"][0]
    assert choice["message"].get("reasoning_content"), body
    assert choice["finish_reason"] == "stop", body
    assert set(json.loads(choice["message"]["content"])) == {"city"}
