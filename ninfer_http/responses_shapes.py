"""The wire shapes of Responses items, and the template message that replays a Response's output.

Output items are `reasoning`, `message`, `function_call`, `custom_tool_call` (a freeform tool:
one string `input`) and `local_shell_call` (an exec `action`). `call_message` turns any call item
back into the template's tool-call shape (`responses_tools` says how each kind is shown).
"""
from __future__ import annotations

import json
from typing import Any

from .ids import hex_id

LOCAL_SHELL = "local_shell"
CUSTOM_INPUT = "input"
CALL_TYPES = ("function_call", "custom_tool_call", "local_shell_call")


def item_id(prefix: str) -> str:
    """`msg_`, `rs_`, `fc_`, `ctc_`, `lsh_`, `call_` ... followed by 32 hex digits."""
    return hex_id(prefix, 32)


def flat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}.{name}" if namespace else name


def reasoning_item(rs_id: str, text: str, sealed: str | None = None) -> dict[str, Any]:
    item = {"id": rs_id, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}
    if sealed is not None:
        item["encrypted_content"] = sealed
    return item


def message_item(msg_id: str, text: str, status: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs or []}]}


def function_call_item(fc_id: str, call_id: str, name: str, namespace: str | None,
                       arguments: str, status: str = "completed") -> dict[str, Any]:
    item = {"id": fc_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}
    if namespace:
        item["namespace"] = namespace
    return item


def custom_call_item(ctc_id: str, call_id: str, name: str, text: str,
                     status: str = "completed") -> dict[str, Any]:
    return {"id": ctc_id, "type": "custom_tool_call", "status": status, "call_id": call_id,
            "name": name, "input": text}


def local_shell_item(lsh_id: str, call_id: str, arguments: dict[str, Any],
                     status: str = "completed") -> dict[str, Any]:
    command = arguments.get("command")
    action = {"type": "exec", "command": command if isinstance(command, list) else [],
              "timeout_ms": arguments.get("timeout_ms"),
              "working_directory": arguments.get("workdir"),
              "env": arguments.get("env") or {}, "user": None}
    return {"id": lsh_id, "type": "local_shell_call", "status": status, "call_id": call_id,
            "action": action}


def local_shell_arguments(action: dict[str, Any]) -> dict[str, Any]:
    """A `local_shell_call` action -> the arguments of the template's `local_shell` function."""
    arguments = {"command": action.get("command") or [], "workdir": action.get("working_directory"),
                 "timeout_ms": action.get("timeout_ms"), "env": action.get("env")}
    return {k: v for k, v in arguments.items() if v not in (None, {})}


def call_message(item: dict[str, Any]) -> dict[str, Any]:
    """Any call item -> one entry of the template message's `tool_calls`."""
    if item["type"] == "custom_tool_call":
        name, arguments = item["name"], {CUSTOM_INPUT: item["input"]}
    elif item["type"] == "local_shell_call":
        name, arguments = LOCAL_SHELL, local_shell_arguments(item.get("action") or {})
    else:
        name = flat_name(item["name"], item.get("namespace"))
        arguments = _decoded_or_raw(item["arguments"])
    return {"type": "function", "id": item["call_id"],
            "function": {"name": name, "arguments": arguments}}


def output_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant template message that replays a Response's output in a continuation."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        if item["type"] == "reasoning":
            message["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            message["content"] += item["content"][0]["text"]
        elif item["type"] in CALL_TYPES:
            message.setdefault("tool_calls", []).append(call_message(item))
    return message


def _decoded_or_raw(arguments: str) -> dict[str, Any] | str:
    # Templates serialise an object themselves; model output that is no JSON object stays as is.
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments
