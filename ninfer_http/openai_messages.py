"""Chat Completions `messages` and `tools` -> the chat template's message shape (contract §5).

The template receives `{"role", "content": str}` plus, where present, `reasoning_content`,
`tool_calls` (arguments decoded to an object when they are a JSON object, as HF templates
expect), `tool_call_id` and `name`. `developer` becomes `system`; legacy `function` becomes
`tool`. Media parts (`image_url`, `video_url`) become markers in the text (`media_markers`),
loaded and checked against `--vision` when the request is prepared (`media.py`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import invalid_value, missing, unsupported
from .forced_tools import ForcedCall, auto_grammar, call_grammar
from .media_markers import media_marker

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_TEMPLATE_ROLE = {"developer": "system", "function": "tool"}


def normalize_messages(value: Any) -> list[dict[str, Any]]:
    """Validate `messages` and convert each to the template's shape."""
    if value is None:
        raise missing("messages")
    if not isinstance(value, list) or not value:
        raise invalid_value("messages", "'messages' must be a non-empty array.")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def _message(message: Any, path: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise invalid_value(path, f"'{path}' must be an object.")
    role = message.get("role")
    if role is None:
        raise missing(f"{path}.role")
    if role not in ROLES:
        raise invalid_value(f"{path}.role", f"'{path}.role' must be one of {', '.join(ROLES)}.")
    out: dict[str, Any] = {"role": _TEMPLATE_ROLE.get(role, role)}
    content = message.get("content")
    if content is None and role not in ("assistant", "function"):
        raise missing(f"{path}.content")
    out["content"] = content_text(content, f"{path}.content")
    if role == "assistant":
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise invalid_value(f"{path}.reasoning_content", "Reasoning must be a string.")
            out["reasoning_content"] = reasoning
        if message.get("tool_calls") is not None:
            out["tool_calls"] = _tool_calls(message["tool_calls"], f"{path}.tool_calls")
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise invalid_value(f"{path}.{key}", f"'{path}.{key}' must be a string.")
            out[key] = value
    return out


def content_text(content: Any, path: str) -> str:
    """A string or an array of parts -> the text the template sees (parts joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_value(path, f"'{path}' must be a string or an array of content parts.")
    return "\n".join(_part_text(part, f"{path}[{i}]") for i, part in enumerate(content))


def _part_text(part: Any, path: str) -> str:
    if not isinstance(part, dict):
        raise invalid_value(path, f"'{path}' must be an object.")
    kind = part.get("type")
    if kind in ("text", "refusal"):
        text = part.get(kind)
        if not isinstance(text, str):
            raise invalid_value(f"{path}.{kind}", f"'{path}.{kind}' must be a string.")
        return text
    if kind in ("image_url", "video_url"):
        return _media_part(part, kind, path)
    if kind in ("input_audio", "audio"):
        raise unsupported(path, "Audio input is not supported.")
    if kind == "file":
        raise unsupported(path, "File content parts are not supported.")
    raise invalid_value(f"{path}.type", f"Unknown content part type {kind!r}.")


def _media_part(part: dict[str, Any], kind: str, path: str) -> str:
    media = part.get(kind)
    url = media.get("url") if isinstance(media, dict) else media
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "data:")):
        raise invalid_value(f"{path}.{kind}.url", "Media URLs must be http(s):// or data: URLs.")
    detail = media.get("detail") if isinstance(media, dict) else None
    if detail not in (None, "auto"):
        raise unsupported(f"{path}.detail", "Only image detail 'auto' is supported.")
    return media_marker("image" if kind == "image_url" else "video", url, path)


def _tool_calls(value: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise invalid_value(path, f"'{path}' must be an array.")
    calls = []
    for i, call in enumerate(value):
        where = f"{path}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid_value(f"{where}.function", "A tool call needs function.name.")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise invalid_value(f"{where}.function.arguments", "Arguments must be a string.")
        entry = {"type": "function", "function": {"name": function["name"],
                                                  "arguments": _decoded(arguments)}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        calls.append(entry)
    return calls


def _decoded(arguments: str | dict[str, Any]) -> str | dict[str, Any]:
    # HF templates serialise `arguments` themselves, so a JSON-object string becomes an object.
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


@dataclass(frozen=True)
class ChatTools:
    """The tools shown to the template and the grammar of the answer (None: free), with the
    field that asked for it (error messages)."""

    template: list[dict[str, Any]] | None
    grammar: str | None = None
    param: str = "response_format"


def normalize_tools(tools: Any, tool_choice: Any, parallel_tool_calls: Any,
                    answer: str | None = None) -> ChatTools:
    """The function tools to show the template, after `tool_choice`; `required` or a named
    function forces a call (strict tools' arguments then match their schema exactly); under
    `auto` a strict tool's call, when the model makes one, matches its schema. `answer` is the
    grammar of `response_format` (None: text)."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise invalid_value("tools", "'tools' must be an array.")
    for i, tool in enumerate(tools):
        _check_tool(tool, f"tools[{i}]")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise invalid_value("parallel_tool_calls", "'parallel_tool_calls' must be a boolean.")
    strict = frozenset(t["function"]["name"] for t in tools if t["function"].get("strict"))
    allowed, forced = _choice(tool_choice)
    if allowed is not None:
        tools = [t for t in tools if t["function"]["name"] in allowed]
    parallel = parallel_tool_calls is not False
    if forced is not None:
        if answer is not None:
            raise invalid_value("response_format", "response_format cannot constrain an answer "
                                "that tool_choice forces to be a tool call.")
        return ChatTools(tools or None, call_grammar(forced, tools, parallel, strict,
                                                     "tool_choice"), "tool_choice")
    grammar = auto_grammar(tools, parallel, strict, answer=answer)
    if grammar is not None:
        return ChatTools(tools or None, grammar, "tools")
    return ChatTools(tools or None, answer)


def _check_tool(tool: Any, path: str) -> None:
    if not isinstance(tool, dict):
        raise invalid_value(path, f"'{path}' must be an object.")
    if tool.get("type") != "function":
        raise unsupported(f"{path}.type", "Only function tools are supported.")
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid_value(f"{path}.function.name", "A function tool needs a name.")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_value(f"{path}.function.strict", "'strict' must be a boolean.")


def _names(tools: Any, path: str) -> set[str]:
    if not isinstance(tools, list):
        raise invalid_value(path, f"'{path}' must be an array.")
    return {t["function"]["name"] for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)}


def _choice(choice: Any) -> tuple[set[str] | None, ForcedCall | None]:
    """(allowed names, None = every tool; an empty set = none) and the forced call, if any."""
    if choice is None or choice == "auto":
        return None, None
    if choice == "none":
        return set(), None
    if choice == "required":
        return None, ForcedCall()
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid_value("tool_choice.function.name", "A named tool_choice needs "
                                "function.name.")
        return None, ForcedCall(frozenset({function["name"]}), once=True)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        spec = choice.get("allowed_tools")
        if not isinstance(spec, dict):
            raise invalid_value("tool_choice.allowed_tools", "allowed_tools needs 'tools'.")
        mode = spec.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid_value("tool_choice.allowed_tools.mode", "mode must be 'auto' or "
                                "'required'.")
        names = _names(spec.get("tools"), "tool_choice.allowed_tools.tools")
        return names, ForcedCall() if mode == "required" else None
    raise invalid_value("tool_choice", "'tool_choice' must be 'auto', 'none', 'required', a "
                        "named function or allowed_tools.")
