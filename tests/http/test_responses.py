"""OpenAI Responses (§6) through the official `openai` SDK and raw HTTP."""
from __future__ import annotations

import json
import re

import openai
import pytest

from fake_engine import Script
from ninfer_engine.types import EngineError

HEX32 = "[0-9a-f]{32}"
THINK_AND_CALL = ("<think>", "Let me look.", "</think>", "Checking. ",
                  '<tool_call>{"name": "crm.lookup", "arguments": {"id": 7}}</tool_call>')
CRM_TOOLS = [{"type": "namespace", "name": "crm", "description": "Customer records", "tools": [
    {"type": "function", "name": "lookup", "description": "Find a customer",
     "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}}}]}]


def sdk(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def create(live, **fields):
    body = {"model": "fake-model", "input": "Hi"}
    body.update(fields)
    return live.request("POST", "/v1/responses", body)


def sse_blocks(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of every SSE event, checking the data repeats the name as `type`."""
    blocks = []
    for block in body.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        blocks.append((name, data))
    return blocks


def rendered(live) -> list[dict]:
    return live.engine.chat_template.calls[-1]["messages"]


def test_sdk_create(live):
    live.engine.script = Script(cached_tokens=2)
    response = sdk(live).responses.create(model="fake-model", input="Hi", metadata={"k": "v"})
    assert re.fullmatch(f"resp_{HEX32}", response.id)
    assert (response.object, response.status, response.model) == ("response", "completed",
                                                                   "fake-model")
    assert response.output_text == "Hello, world!"
    [message] = response.output
    assert re.fullmatch(f"msg_{HEX32}", message.id)
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert response.error is None and response.incomplete_details is None
    assert response.completed_at is not None
    prompt = len(live.engine.submitted[-1].prompt_ids)
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (prompt, 4, prompt + 4)
    assert usage.input_tokens_details.cached_tokens == 2
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.metadata == {"k": "v"} and response.store is True
    assert response.max_output_tokens is None and response.tool_choice == "auto"
    assert response.text.format.type == "text" and response.truncation == "disabled"
    assert (response.temperature, response.top_p) == (0.7, 0.8)  # the engine's defaults
    assert rendered(live) == [{"role": "user", "content": "Hi"}]


def test_raw_stream_events_and_sequence_numbers(live):
    reply = create(live, stream=True)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert b"[DONE]" not in reply.body
    blocks = sse_blocks(reply.body)
    assert [name for name, _ in blocks] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 4,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [data["sequence_number"] for _, data in blocks] == list(range(len(blocks)))
    assert blocks[0][1]["response"]["status"] == "in_progress"
    assert "".join(d["delta"] for n, d in blocks if n.endswith(".delta")) == "Hello, world!"
    assert blocks[8][1]["text"] == "Hello, world!"
    final = blocks[-1][1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == \
        "Hello, world!"


def test_sdk_stream_with_reasoning_and_namespaced_call(live):
    live.engine.script = Script(pieces=THINK_AND_CALL)
    with sdk(live).responses.stream(model="fake-model", input="Who is 7?",
                                    tools=CRM_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.reasoning_text.delta" in types
    assert types[-5:] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    reasoning, message, call = final.output
    assert re.fullmatch(f"rs_{HEX32}", reasoning.id)
    assert reasoning.content[0].text == "Let me look."
    assert message.content[0].text == "Checking."
    assert re.fullmatch(f"fc_{HEX32}", call.id) and re.fullmatch(f"call_{HEX32}", call.call_id)
    assert (call.namespace, call.name, json.loads(call.arguments)) == ("crm", "lookup", {"id": 7})
    assert final.usage.output_tokens_details.reasoning_tokens == 2  # "<think>", "Let me look."
    [tool] = live.engine.chat_template.calls[-1]["tools"]
    assert tool["function"]["name"] == "crm.lookup"


def test_sdk_create_stream_true_iterates_every_event(live):
    events = list(sdk(live).responses.create(model="fake-model", input="Hi", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Hello, world!"


def test_previous_response_id_chains_the_conversation(live):
    client = sdk(live)
    first = client.responses.create(model="fake-model", input="Hi", instructions="Be brief.")
    assert rendered(live)[0] == {"role": "system", "content": "Be brief."}
    second = client.responses.create(model="fake-model", input="And again?",
                                     previous_response_id=first.id)
    assert rendered(live) == [{"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello, world!"},
                              {"role": "user", "content": "And again?"}]
    assert second.previous_response_id == first.id
    sessions = [r.session_key for r in live.engine.submitted]
    assert sessions == [first.id, first.id]


def test_tool_output_continues_a_stored_call(live):
    live.engine.script = Script(pieces=THINK_AND_CALL)
    client = sdk(live)
    first = client.responses.create(model="fake-model", input="Who is 7?", tools=CRM_TOOLS)
    call = first.output[-1]
    live.engine.script = Script()
    client.responses.create(model="fake-model", previous_response_id=first.id, tools=CRM_TOOLS,
                            input=[{"type": "function_call_output", "call_id": call.call_id,
                                    "output": "Ada"}])
    assistant, tool = rendered(live)[1:]
    assert assistant["reasoning_content"] == "Let me look."
    assert assistant["tool_calls"] == [{"type": "function", "id": call.call_id, "function": {
        "name": "crm.lookup", "arguments": {"id": 7}}}]
    assert tool == {"role": "tool", "tool_call_id": call.call_id, "content": "Ada"}


def test_item_input_becomes_template_messages(live):
    reply = create(live, instructions="Rules.", input=[
        {"role": "developer", "content": "Dev."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                       {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"role": "user", "content": "next"}])
    assert reply.status == 200
    assert rendered(live) == [
        {"role": "system", "content": "Rules.\n\nDev."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "ok", "reasoning_content": "r", "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "user", "content": "next"}]


@pytest.mark.parametrize("reasoning, kwargs", [
    ({"effort": "high"}, {"reasoning_effort": "xhigh"}),
    ({"effort": "minimal", "summary": "auto"}, {"reasoning_effort": "low"}),
    ({"effort": "none"}, {"enable_thinking": False}),
])
def test_reasoning_effort_is_mapped(live, reasoning, kwargs):
    assert create(live, reasoning=reasoning).status == 200
    assert live.engine.chat_template.calls[-1]["kwargs"] == kwargs


def test_continuation_inherits_preserve_thinking(live):
    first = create(live, preserve_thinking=True).json()
    create(live, previous_response_id=first["id"], input="more")
    assert live.engine.chat_template.calls[-1]["kwargs"] == {"preserve_thinking": True}
    create(live, previous_response_id=first["id"], input="more", preserve_thinking=False)
    assert live.engine.chat_template.calls[-1]["kwargs"] == {"preserve_thinking": False}


def test_retrieve_and_delete(live):
    client = sdk(live)
    created = client.responses.create(model="fake-model", input="Hi")
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    reply = live.request("DELETE", f"/v1/responses/{created.id}")
    assert reply.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
    for method in ("GET", "DELETE"):
        reply = live.request(method, f"/v1/responses/{created.id}")
        assert reply.status == 404
        assert reply.json()["error"]["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_store_false_is_not_retrievable_or_continuable(live):
    created = create(live, store=False).json()
    assert created["store"] is False
    assert live.request("GET", f"/v1/responses/{created['id']}").status == 404
    reply = create(live, previous_response_id=created["id"])
    assert reply.status == 404
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("response_not_found", "previous_response_id")


def test_input_items_pagination(live):
    client = sdk(live)
    texts = [f"m{i}" for i in range(5)]
    created = client.responses.create(model="fake-model", input=[
        {"role": "user", "content": t} for t in texts])
    items = client.responses.input_items
    desc = items.list(created.id)
    assert [i.content[0].text for i in desc.data] == texts[::-1]
    assert all(re.fullmatch(f"msg_{HEX32}", i.id) for i in desc.data)
    assert (desc.first_id, desc.last_id, desc.has_more) == (desc.data[0].id, desc.data[-1].id,
                                                            False)
    page = items.list(created.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["m0", "m1"] and page.has_more
    rest = items.list(created.id, order="asc", after=page.last_id, limit=10)
    assert [i.content[0].text for i in rest.data] == ["m2", "m3", "m4"] and not rest.has_more
    walked = [i.content[0].text for i in items.list(created.id, order="asc", limit=2)]
    assert walked == texts  # the SDK follows `after` through every page


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=x", "order=up", "after=msg_x"])
def test_input_items_invalid_pagination(live, query):
    created = create(live).json()
    reply = live.request("GET", f"/v1/responses/{created['id']}/input_items?{query}")
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "invalid_pagination"


def test_input_tokens(live):
    client = sdk(live)
    counted = client.responses.input_tokens.count(model="fake-model", input="Hi")
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == len("<user>Hi\n<assistant>")
    assert live.engine.submitted == []


def test_max_output_tokens_gives_incomplete(live):
    live.engine.script = Script(finish="length")
    body = create(live, max_output_tokens=4).json()
    assert body["status"] == "incomplete" and body["max_output_tokens"] == 4
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert live.engine.submitted[-1].max_tokens == 4
    blocks = sse_blocks(create(live, max_output_tokens=4, stream=True).body)
    assert blocks[-1][0] == "response.incomplete"


def test_failure_after_output_is_response_failed(live):
    live.engine.script = Script(fail=EngineError("boom", "internal_error", 500))
    blocks = sse_blocks(create(live, stream=True).body)
    name, data = blocks[-1]
    assert name == "response.failed"
    assert data["response"]["status"] == "failed"
    assert data["response"]["error"] == {"code": "internal_error", "message": "boom"}
    assert [n for n, _ in blocks].count("response.output_item.done") == 1
    assert create(live).status == 500


def test_store_evicts_least_recently_used(serve):
    live = serve(response_store_max_records=2)
    ids = [create(live).json()["id"] for _ in range(2)]
    assert live.request("GET", f"/v1/responses/{ids[0]}").status == 200  # now most recent
    ids.append(create(live).json()["id"])
    assert [live.request("GET", f"/v1/responses/{i}").status for i in ids] == [200, 404, 200]


def test_store_capacity_exceeded(serve):
    live = serve(response_store_max_mib=0)
    reply = create(live)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "response_store_capacity_exceeded"
    assert live.engine.submitted == []
    assert create(live, store=False).status == 200


@pytest.mark.parametrize("fields, code, param", [
    ({"text": {"format": {"type": "xml"}}}, "invalid_value", "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "invalid_value", "text.format.schema"),
    ({"text": {"verbosity": "loud"}}, "invalid_value", "text.verbosity"),
    ({"include": [3]}, "invalid_value", "include"),
    ({"client_metadata": {"k": 1}}, "invalid_value", "client_metadata"),
    ({"parallel_tool_calls": "no"}, "invalid_value", "parallel_tool_calls"),
    ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "g"},
      "tools": [{"type": "function", "name": "f"}]}, "invalid_value", "tool_choice"),
    ({"tool_choice": {"type": "web_search"}, "tools": [{"type": "web_search"}]},
     "unsupported_parameter", "tool_choice"),
    ({"tools": [{"type": "custom"}]}, "invalid_value", "tools[0].name"),
    ({"input": [{"type": "local_shell_call", "call_id": "c", "action": {"type": "exec"}}]},
     "invalid_value", "input[0].action"),
    ({"truncation": "auto"}, "unsupported_parameter", "truncation"),
    ({"top_logprobs": 21}, "invalid_value", "top_logprobs"),
    ({"background": True}, "background_not_supported", "background"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
    ({"temperature": 2.5}, "invalid_value", "temperature"),
    ({"top_p": 1.5}, "invalid_value", "top_p"),
    ({"max_output_tokens": -1}, "invalid_value", "max_output_tokens"),
    ({"reasoning": {"effort": "huge"}}, "invalid_value", "reasoning.effort"),
    ({"input": None}, "missing_required_parameter", "input"),
    ({"input": []}, "invalid_value", "input"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "unsupported_parameter",
     "input[0].type"),
    ({"input": [{"type": {"a": 1}}]}, "invalid_value", "input[0].type"),  # not a 500
    ({"input": [{"role": "user", "content": [{"type": ["x"]}]}]}, "invalid_value",
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "vision_disabled", "input[0].content[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     "invalid_value", "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
     "invalid_tool_history", "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"role": "user", "content": "x"}]}, "invalid_tool_history", "input[1]"),
    ({"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "x"}]},
     "invalid_assistant_history", "input[1]"),
    ({"input": "x" * 300}, "context_length_exceeded", "input"),
])
def test_create_rejections(live, fields, code, param):
    reply = create(live, **fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert live.engine.submitted == []


def test_model_must_match(live):
    reply = create(live, model="gpt-5")
    assert reply.status == 404
    assert reply.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("query, code, param", [
    ("include=reasoning.encrypted_content", "unsupported_parameter", "include"),
    ("include[]=x", "unsupported_parameter", "include"),
    ("starting_after=3", "unsupported_parameter", "starting_after"),
    ("stream=true", "unsupported_parameter", "stream"),
    ("verbose=1", "unknown_parameter", "verbose"),
])
def test_retrieve_rejections(live, query, code, param):
    created = create(live).json()
    reply = live.request("GET", f"/v1/responses/{created['id']}?{query}")
    assert reply.status == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert live.request("GET", f"/v1/responses/{created['id']}?stream=false").status == 200


@pytest.mark.parametrize("method, path, status, code", [
    ("POST", "/v1/responses/resp_x/cancel", 400, "background_not_supported"),
    ("POST", "/v1/responses/resp_x/compact", 400, "compaction_not_supported"),
    ("POST", "/v1/responses/compact", 400, "compaction_not_supported"),
    ("GET", "/v1/responses/resp_x/input_items", 404, "response_not_found"),
    ("GET", "/v1/responses", 405, "method_not_allowed"),
    ("PUT", "/v1/responses/resp_x", 405, "method_not_allowed"),
    ("GET", "/v1/responses/resp_x/other", 404, "not_found"),
])
def test_other_routes(live, method, path, status, code):
    reply = live.request(method, path)
    assert reply.status == status
    assert reply.json()["error"]["code"] == code
    assert reply.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize("tool_choice, names", [
    ("auto", ["crm.lookup", "ping"]),
    ("none", None),
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "ping"}]},
     ["ping"]),
])
def test_tool_choice_filters_the_template_tools(live, tool_choice, names):
    tools = [*CRM_TOOLS, {"type": "function", "name": "ping"}]
    body = create(live, tools=tools, tool_choice=tool_choice).json()
    assert body["tools"] == tools and body["tool_choice"] == tool_choice
    shown = live.engine.chat_template.calls[-1]["tools"]
    assert (shown and [t["function"]["name"] for t in shown]) == names


@pytest.mark.parametrize("query, status, code", [
    ("include=message.input_image.image_url", 200, None),
    ("include=file_search_call.results", 400, "invalid_value"),
    ("before=x", 400, "unknown_parameter"),
])
def test_input_items_query_keys(live, query, status, code):
    created = create(live).json()
    reply = live.request("GET", f"/v1/responses/{created['id']}/input_items?{query}")
    assert reply.status == status
    if code:
        assert reply.json()["error"]["code"] == code


LOGPROB_PIECES = ("<think>", "Hm.", "</think>", "Hello", ", world")


@pytest.mark.parametrize("stream", [False, True])
def test_output_text_logprobs(serve, stream):
    from test_completions import LogprobEngine

    live = serve(LogprobEngine(Script(pieces=LOGPROB_PIECES)))
    fields = dict(model="fake-model", input="Hi", top_logprobs=2,
                  include=["message.output_text.logprobs"])
    if stream:
        events = list(sdk(live).responses.create(**fields, stream=True))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        streamed = [entry for e in deltas for entry in e.logprobs]
        [done] = [e for e in events if e.type == "response.output_text.done"]
        response = events[-1].response
        assert [e.token for e in done.logprobs] == [e.token for e in streamed]
    else:
        response = sdk(live).responses.create(**fields)
    assert response.top_logprobs == 2
    [message] = [item for item in response.output if item.type == "message"]
    entries = message.content[0].logprobs
    # the answer's tokens only (the 4th and 5th output tokens; the fake engine's token ids are
    # 1-based positions), each with its two alternatives
    assert [e.logprob for e in entries] == [-0.25 * 4, -0.25 * 5]
    assert all([t.logprob for t in e.top_logprobs] == [-0.5, -1.0] for e in entries)
    assert all(e.bytes == list(e.token.encode()) for e in entries)
    if stream:
        assert [e.logprob for e in streamed] == [e.logprob for e in entries]
    plain = sdk(live).responses.create(model="fake-model", input="Hi")
    assert plain.output[-1].content[0].logprobs == []
