"""Responses items <-> the chat template's messages (contract §6 `input`, `output`).

`Conversation` turns input items into template messages, continuing a stored conversation:
reasoning, assistant text and function calls of one turn merge into one assistant message
(`reasoning_content`, `content`, `tool_calls`); each `function_call_output` becomes a `tool`
message. Items in an impossible order are `invalid_assistant_history` (a reasoning item not
followed by its answer) or `invalid_tool_history` (a call without its output, an output without
its call). Every input item is kept, normalized and with a fresh id, for the input_items listing.
Namespaced functions are shown to the template as `<namespace>.<name>`.

Codex's history items are understood too: `custom_tool_call` / `custom_tool_call_output` (a
freeform tool's string input and its output), `local_shell_call` (its output comes as a
`function_call_output`), and reasoning items whose `encrypted_content` this server sealed
(`reasoning_seal`); calls of hosted tools (`web_search_call`, ...) carry nothing the model can
use here and are skipped (logged once).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .errors import ApiError, invalid_value, missing, unsupported
from .ignored import log_ignored
from .media_markers import media_marker
from .responses_shapes import (
    CUSTOM_INPUT,
    call_message,
    custom_call_item,
    function_call_item,
    item_id,
    local_shell_arguments,
    local_shell_item,
    reasoning_item,
)

_TEMPLATE_ROLE = {"user": "user", "system": "system", "developer": "system",
                  "assistant": "assistant"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = ("input_image", "input_video")
# Items of tools that run on OpenAI's side: a replayed history may hold them; nothing to show.
HOSTED_CALLS = frozenset({"web_search_call", "file_search_call", "image_generation_call",
                          "code_interpreter_call", "computer_call", "computer_call_output",
                          "mcp_call", "mcp_list_tools", "mcp_approval_request",
                          "mcp_approval_response", "tool_search_call", "tool_search_output"})


def _str(item: dict[str, Any], key: str, path: str, required: bool = True) -> str | None:
    value = item.get(key)
    if value is None and required:
        raise missing(f"{path}.{key}")
    if value is not None and not isinstance(value, str):
        raise invalid_value(f"{path}.{key}", f"'{path}.{key}' must be a string.")
    return value


def _history_error(code: str, message: str, path: str) -> ApiError:
    return ApiError(400, message, code, param=path)


def parts_text(content: Any, path: str) -> tuple[str, list[dict[str, Any]]]:
    """Message content (a string or parts) -> its text and its parts, validated."""
    if isinstance(content, str):
        return content, [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise invalid_value(path, f"'{path}' must be a string or an array of content parts.")
    texts, parts = [], []
    for i, part in enumerate(content):
        where = f"{path}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):  # a dict or list `type` must not reach the dict lookup
            raise invalid_value(f"{where}.type", f"Unknown content part type {kind!r}.")
        if kind in _MEDIA_PARTS:
            text, part = _media_part(part, kind, where)
            texts.append(text)
            parts.append(part)
            continue
        if kind in ("input_file", "input_audio"):
            raise unsupported(where, f"Content parts of type '{kind}' are not supported.")
        if kind not in _TEXT_PARTS:
            raise invalid_value(f"{where}.type", f"Unknown content part type {kind!r}.")
        key = _TEXT_PARTS[kind]
        text = _str(part, key, where)
        texts.append(text)
        parts.append({"type": kind, key: text, **({"annotations": []} if kind == "output_text"
                                                   else {})})
    return "\n".join(texts), parts


def _media_part(part: dict[str, Any], kind: str, path: str) -> tuple[str, dict[str, Any]]:
    """An `input_image` (`image_url`) or `input_video` (`video_url`, ours) part: its marker
    and the part as stored."""
    field = "image_url" if kind == "input_image" else "video_url"
    if part.get("file_id") is not None:
        raise unsupported(f"{path}.file_id", "Media by file id is not supported; send a URL.")
    url = _str(part, field, path)
    if not url.startswith(("http://", "https://", "data:")):
        raise invalid_value(f"{path}.{field}", "Media URLs must be http(s):// or data: URLs.")
    if part.get("detail") not in (None, "auto"):
        raise unsupported(f"{path}.detail", "Only image detail 'auto' is supported.")
    stored = {"type": kind, field: url, **({"detail": "auto"} if kind == "input_image" else {})}
    return media_marker("image" if kind == "input_image" else "video", url, path), stored


def decoded_arguments(arguments: str, path: str) -> dict[str, Any]:
    """A function call's `arguments`, which must be a JSON object string."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise invalid_value(path, f"'{path}' must be a JSON object encoded as a string.")
    return value


class Conversation:
    """Template messages built item by item after an (already valid) earlier conversation."""

    def __init__(self, previous: tuple[dict[str, Any], ...] = (),
                 open_reasoning: Callable[[str], str | None] | None = None) -> None:
        self.open_reasoning = open_reasoning  # sealed `encrypted_content` -> text, or None
        self.messages: list[dict[str, Any]] = list(previous)
        self.items: list[dict[str, Any]] = []
        self.pending: set[str] = set()  # call ids still waiting for their output
        self.turn: dict[str, Any] | None = None  # the open assistant message
        if previous and previous[-1].get("role") == "assistant":
            self.pending = {c["id"] for c in previous[-1].get("tool_calls", ())}

    def add_all(self, value: Any) -> None:
        """`input`: a string (one user message) or an array of items."""
        if isinstance(value, str):
            self._message({"role": "user", "content": value}, "input")
        elif isinstance(value, list) and value:
            for i, item in enumerate(value):
                self.add(item, f"input[{i}]")
        else:
            raise invalid_value("input", "'input' must be a string or a non-empty array of items.")
        self.finish("input")

    def add(self, item: Any, path: str) -> None:
        if not isinstance(item, dict):
            raise invalid_value(path, f"'{path}' must be an object.")
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise invalid_value(f"{path}.type", f"'{path}.type' must be a string.")
        handlers = {"message": self._message, "reasoning": self._reasoning,
                    "function_call": self._function_call,
                    "function_call_output": self._function_call_output,
                    "custom_tool_call": self._custom_tool_call,
                    "custom_tool_call_output": self._function_call_output,
                    "local_shell_call": self._local_shell_call,
                    "local_shell_call_output": self._function_call_output}
        if kind in HOSTED_CALLS:
            log_ignored("Responses input item", [kind])
            return
        if kind not in handlers:
            raise unsupported(f"{path}.type", f"Input items of type {kind!r} are not supported.")
        handlers[kind](item, path)

    def finish(self, path: str) -> None:
        """The conversation ends here: nothing may wait for an answer or an output."""
        self._close_turn(path)
        if self.pending:
            raise _history_error("invalid_tool_history", "No function_call_output was given for "
                                 f"call_id {sorted(self.pending)[0]!r}.", path)

    def _close_turn(self, path: str) -> None:
        turn = self.turn
        if turn is not None and not turn["content"] and not turn.get("tool_calls"):
            raise _history_error("invalid_assistant_history", "A reasoning item must be followed "
                                 "by an assistant message or a function call.", path)
        self.turn = None

    def _new_turn(self, path: str) -> dict[str, Any]:
        self._close_turn(path)
        if self.pending:
            raise _history_error("invalid_tool_history", "Every function_call needs its "
                                 "function_call_output before the conversation goes on.", path)
        self.turn = {"role": "assistant", "content": ""}
        self.messages.append(self.turn)
        return self.turn

    def _message(self, item: dict[str, Any], path: str) -> None:
        role = _str(item, "role", path)
        if role not in _TEMPLATE_ROLE:
            raise invalid_value(f"{path}.role", f"'{path}.role' must be one of "
                                f"{', '.join(_TEMPLATE_ROLE)}.")
        if item.get("content") is None:
            raise missing(f"{path}.content")
        text, parts = parts_text(item["content"], f"{path}.content")
        if role == "assistant":
            parts = [{"type": "output_text", "text": p["text"], "annotations": []}
                     if p["type"] == "input_text" else p for p in parts]
            turn = self.turn
            if turn is None or turn["content"] or turn.get("tool_calls"):
                turn = self._new_turn(path)
            turn["content"] = text
        else:
            self.finish(path)
            self.messages.append({"role": _TEMPLATE_ROLE[role], "content": text})
        self.items.append({"id": item_id("msg_"), "type": "message", "role": role,
                           "content": parts, "status": "completed"})

    def _reasoning(self, item: dict[str, Any], path: str) -> None:
        content = item.get("content") or []
        if not isinstance(content, list):
            raise invalid_value(f"{path}.content", f"'{path}.content' must be an array.")
        texts = []
        for i, part in enumerate(content):
            where = f"{path}.content[{i}]"
            if not isinstance(part, dict) or part.get("type") != "reasoning_text":
                raise invalid_value(where, f"'{where}' must be a reasoning_text part.")
            texts.append(_str(part, "text", where))
        sealed = _str(item, "encrypted_content", path, required=False)
        opened = self.open_reasoning(sealed) if sealed and self.open_reasoning else None
        # a blob this server sealed restores the reasoning; any other blob is ignored
        reasoning = opened if opened is not None else "\n".join(texts)
        self._new_turn(path)["reasoning_content"] = reasoning
        self.items.append(reasoning_item(item_id("rs_"), reasoning, sealed))

    def _function_call(self, item: dict[str, Any], path: str) -> None:
        call_id = _str(item, "call_id", path)
        name = _str(item, "name", path)
        namespace = _str(item, "namespace", path, required=False)
        arguments = _str(item, "arguments", path)
        decoded_arguments(arguments, f"{path}.arguments")  # must be a JSON object string
        self._call(function_call_item(item_id("fc_"), call_id, name, namespace, arguments), path)

    def _custom_tool_call(self, item: dict[str, Any], path: str) -> None:
        call_id = _str(item, "call_id", path)
        name = _str(item, "name", path)
        text = _str(item, CUSTOM_INPUT, path)
        self._call(custom_call_item(item_id("ctc_"), call_id, name, text), path)

    def _local_shell_call(self, item: dict[str, Any], path: str) -> None:
        # Codex's item may carry only `id`; its output answers whichever it sent
        call_id = _str(item, "call_id", path, required=False) or _str(item, "id", path)
        action = item.get("action")
        if not isinstance(action, dict) or not isinstance(action.get("command"), list):
            raise invalid_value(f"{path}.action", "A local_shell_call needs an exec action "
                                "with a command array.")
        arguments = local_shell_arguments(action)
        self._call(local_shell_item(item_id("lsh_"), call_id, arguments), path)

    def _call(self, stored: dict[str, Any], path: str) -> None:
        """One call of the open assistant turn (a new turn if none is open)."""
        call_id = stored["call_id"]
        if call_id in self.pending:
            raise _history_error("invalid_tool_history", f"call_id {call_id!r} is used twice.",
                                 f"{path}.call_id")
        turn = self.turn
        if turn is None:
            turn = self._new_turn(path)
        turn.setdefault("tool_calls", []).append(call_message(stored))
        self.pending.add(call_id)
        self.items.append(stored)

    def _function_call_output(self, item: dict[str, Any], path: str) -> None:
        call_id = _str(item, "call_id", path)
        output = item.get("output")
        if output is None:
            raise missing(f"{path}.output")
        text, _ = parts_text(output, f"{path}.output")
        if call_id not in self.pending:
            raise _history_error("invalid_tool_history", f"function_call_output {call_id!r} does "
                                 "not answer a preceding function_call.", f"{path}.call_id")
        self._close_turn(path)
        self.pending.discard(call_id)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        kind = item.get("type", "function_call_output")
        self.items.append({"id": item_id("fc_"), "type": kind, "call_id": call_id,
                           "output": output, "status": "completed"})
