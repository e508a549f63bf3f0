"""Responses accepts what Codex sends (issue 21): extra fields, custom / local_shell / hosted
tools, Codex's history items, sealed reasoning, parallel_tool_calls and prompt_cache_key."""
from __future__ import annotations

import json
import logging
import uuid

import openai
import pytest
from test_responses import create, sse_blocks

APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
PATCH = "*** Begin Patch\n*** End Patch\n"
PATCH_CALL = ('<tool_call>{"name": "apply_patch", "arguments": {"input": '
              + json.dumps(PATCH) + '}}</tool_call>')
SHELL_CALL = ('<tool_call>{"name": "local_shell", "arguments": {"command": ["ls", "-l"], '
              '"workdir": "/tmp"}}</tool_call>')


def test_codex_fields_are_accepted_and_unknown_keys_logged_once(live, caplog):
    # names no other test used: the log-once memory lives as long as the process
    key, hosted = f"x_{uuid.uuid4().hex}", f"hosted_{uuid.uuid4().hex}"
    fields = {key: {"any": "thing"}, "parallel_tool_calls": False, "prompt_cache_key": "thread-1",
              "text": {"verbosity": "low"}, "client_metadata": {"x-codex-installation-id": "i"},
              "service_tier": "priority", "include": ["reasoning.encrypted_content"],
              "stream_options": {"include_obfuscation": False}, "frequency_penalty": 1,
              "tools": [{"type": "web_search"}, {"type": hosted}]}
    with caplog.at_level(logging.DEBUG, logger="ninfer.http"):
        first = create(live, **fields)
        second = create(live, **fields)
    assert first.status == 200 and second.status == 200, first.body
    ignored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored")]
    assert sum(key in m for m in ignored) == 1
    assert sum(hosted in m for m in ignored) == 1
    assert all(r.levelno == logging.DEBUG for r in caplog.records
               if r.getMessage().startswith("ignored"))
    echoed = first.json()
    assert echoed["service_tier"] == "priority" and echoed["parallel_tool_calls"] is False
    assert echoed["text"] == {"verbosity": "low", "format": {"type": "text"}}
    assert live.engine.chat_template.calls[-1]["tools"] is None  # hosted tools are left out
    assert live.engine.submitted[-1].session_key == "thread-1"


def test_custom_tool_is_one_string_input_and_returns_custom_tool_call(live):
    live.engine.script.pieces = ("Patching. ", PATCH_CALL)
    reply = create(live, tools=[APPLY_PATCH], stream=True)
    [shown] = live.engine.chat_template.calls[-1]["tools"]
    assert shown["function"]["name"] == "apply_patch"
    assert shown["function"]["parameters"]["properties"] == {
        "input": {"type": "string", "description": "The tool's raw input."}}
    assert "start: /.+/" in shown["function"]["description"]  # the grammar is shown
    events = sse_blocks(reply.body)
    names = [name for name, _ in events]
    assert "response.custom_tool_call_input.delta" in names
    done = [d for n, d in events if n == "response.custom_tool_call_input.done"][0]
    assert done["input"] == PATCH
    final = events[-1][1]["response"]
    call = final["output"][-1]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert call["input"] == PATCH and call["call_id"].startswith("call_")


def test_local_shell_is_a_function_and_returns_local_shell_call(live):
    live.engine.script.pieces = (SHELL_CALL,)
    reply = create(live, tools=[{"type": "local_shell"}])
    [shown] = live.engine.chat_template.calls[-1]["tools"]
    assert shown["function"]["name"] == "local_shell"
    assert shown["function"]["parameters"]["required"] == ["command"]
    [call] = reply.json()["output"]
    assert call["type"] == "local_shell_call"
    assert call["action"] == {"type": "exec", "command": ["ls", "-l"], "timeout_ms": None,
                              "working_directory": "/tmp", "env": {}, "user": None}


def test_parallel_tool_calls_false_keeps_the_first_call(live):
    live.engine.script.pieces = (SHELL_CALL, PATCH_CALL)
    tools = [{"type": "local_shell"}, APPLY_PATCH]
    both = create(live, tools=tools).json()["output"]
    assert [item["type"] for item in both] == ["local_shell_call", "custom_tool_call"]
    one = create(live, tools=tools, parallel_tool_calls=False).json()["output"]
    assert [item["type"] for item in one] == ["local_shell_call"]


def test_codex_history_items_reach_the_template(live):
    history = [
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "working_directory": "/w"}},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"role": "user", "content": "next"},
    ]
    assert create(live, input=history).status == 200
    messages = live.engine.chat_template.calls[-1]["messages"]
    assert messages[0]["tool_calls"] == [{"type": "function", "id": "c1", "function": {
        "name": "local_shell", "arguments": {"command": ["ls"], "workdir": "/w"}}}]
    assert messages[1] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    assert messages[2]["tool_calls"][0]["function"] == {"name": "apply_patch",
                                                        "arguments": {"input": PATCH}}
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": "Done!"}
    assert messages[4] == {"role": "user", "content": "next"}


def test_encrypted_reasoning_round_trips_and_foreign_blobs_are_ignored(live):
    live.engine.script.pieces = ("<think>", "secret plan", "</think>", "Answer.")
    first = create(live, store=False, include=["reasoning.encrypted_content"]).json()
    reasoning = first["output"][0]
    blob = reasoning["encrypted_content"]
    assert reasoning["type"] == "reasoning" and "secret plan" not in blob
    plain = create(live, store=False).json()["output"][0]
    assert "encrypted_content" not in plain

    def replay(sealed: str) -> dict:
        items = [{"type": "reasoning", "summary": [], "encrypted_content": sealed},
                 {"role": "assistant", "content": "Answer."},
                 {"role": "user", "content": "and?"}]
        assert create(live, store=False, input=items).status == 200
        return live.engine.chat_template.calls[-1]["messages"][0]

    assert replay(blob)["reasoning_content"] == "secret plan"
    forged = blob[:-4] + ("AAAA" if not blob.endswith("AAAA") else "BBBB")
    assert replay(forged)["reasoning_content"] == ""
    assert replay("gAAAAA-from-another-server")["reasoning_content"] == ""


def test_input_items_of_a_continuation_list_earlier_turns(live):
    first = create(live, input="one").json()
    second = create(live, input="two", previous_response_id=first["id"]).json()
    third = create(live, input="three", previous_response_id=second["id"]).json()
    page = live.request("GET", f"/v1/responses/{third['id']}/input_items?order=asc").json()
    kinds = [(item["type"], item.get("role")) for item in page["data"]]
    assert kinds == [("message", "user"), ("message", "assistant")] * 2 + [("message", "user")]
    texts = [item["content"][0]["text"] for item in page["data"]]
    assert texts[0::2] == ["one", "two", "three"]
    assert page["data"][1]["id"] == first["output"][0]["id"]


@pytest.mark.parametrize("fmt, param", [
    ({"type": "grammar", "syntax": "lark", "definition": "start: undefined_rule"},
     "tools[0].format.definition"),
    ({"type": "grammar", "syntax": "ebnf", "definition": "x"}, "tools[0].format.syntax"),
    ({"type": "grammar", "syntax": "lark"}, "tools[0].format"),
    ({"type": "yaml"}, "tools[0].format.type"),
])
def test_a_custom_tool_grammar_that_cannot_be_enforced_is_400(live, fmt, param):
    sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.responses.create(model="fake-model", input="Hi",
                             tools=[{**APPLY_PATCH, "format": fmt}])
    error = raised.value.body
    assert (error["code"], error["param"]) == ("invalid_value", param), error
    assert live.engine.submitted == []
