"""Responses create body -> `ResponsesRequest` (contract §6 "Create fields").

Unknown top-level keys are 400 `unknown_parameter`; the fields accepted only at one value
(`text.format`, `truncation`, `top_logprobs`, `service_tier`, `background`, `include`) are 400
`unsupported_parameter` at any other. The conversation itself is built by
`responses_items.Conversation`, after the stored one of `previous_response_id`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.config import EngineConfig

from .errors import ApiError, invalid_value, unsupported
from .openai_fields import sampling_overrides, thinking_options
from .prompt import map_effort
from .responses_items import flat_name
from .validate import get_bool, get_int, get_list, get_object, get_str

KNOWN_KEYS = frozenset({
    "model", "input", "instructions", "previous_response_id", "max_output_tokens", "stream",
    "store", "temperature", "top_p", "metadata", "reasoning", "chat_template_kwargs",
    "preserve_thinking", "tools", "tool_choice", "text", "truncation", "top_logprobs",
    "service_tier", "background", "include",
})
MAX_METADATA = 16


@dataclass(frozen=True)
class ResponsesRequest:
    """The validated create fields; `input` is still raw (it needs the stored conversation)."""

    model: str | None
    input: Any
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    stream: bool
    store: bool
    sampling: dict[str, Any]
    template_kwargs: dict[str, Any]
    thinking: str
    preserve_thinking_set: bool  # the request chose preserve_thinking (else the root's applies)
    tools: list[dict[str, Any]] | None  # template function tools after tool_choice
    namespaces: dict[str, tuple[str, str]]  # template name -> (namespace, name)
    echo: dict[str, Any]  # request config echoed in the Response object


def parse_create(body: dict[str, Any], config: EngineConfig) -> ResponsesRequest:
    """Validate every create field except the items of `input`."""
    unknown = sorted(set(body) - KNOWN_KEYS)
    if unknown:
        raise ApiError(400, f"Unknown parameter: '{unknown[0]}'.", "unknown_parameter",
                       param=unknown[0])
    if body.get("input") is None:
        raise ApiError(400, "Missing required parameter: 'input'.", "missing_required_parameter",
                       param="input")
    _check_fixed_values(body)
    max_output = get_int(body, "max_output_tokens", 0)
    metadata = _metadata(body.get("metadata"))
    reasoning = _reasoning(body)
    nested = get_object(body, "chat_template_kwargs") or {}
    preserve_set = (get_bool(body, "preserve_thinking") is not None
                    or nested.get("preserve_thinking") is not None)
    template_kwargs, thinking = thinking_options(
        {"chat_template_kwargs": nested, "preserve_thinking": body.get("preserve_thinking"),
         "reasoning_effort": reasoning["effort"]}, config)
    tools, namespaces = _tools(body.get("tools"))
    tools = _apply_tool_choice(tools, body.get("tool_choice"))
    return ResponsesRequest(
        model=get_str(body, "model"),
        input=body["input"],
        instructions=get_str(body, "instructions"),
        previous_response_id=get_str(body, "previous_response_id"),
        max_output_tokens=max_output,
        stream=bool(get_bool(body, "stream")),
        store=get_bool(body, "store") is not False,
        sampling=sampling_overrides({k: body.get(k) for k in ("temperature", "top_p")}),
        template_kwargs=template_kwargs,
        thinking=thinking,
        preserve_thinking_set=preserve_set,
        tools=tools,
        namespaces=namespaces,
        echo={"instructions": body.get("instructions"), "max_output_tokens": max_output,
              "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
              "metadata": metadata, "previous_response_id": body.get("previous_response_id"),
              "reasoning": reasoning, "text": {"format": {"type": "text"}},
              "truncation": "disabled", "parallel_tool_calls": True},
    )


def _check_fixed_values(body: dict[str, Any]) -> None:
    text = get_object(body, "text") or {}
    for key in text:
        if key != "format":
            raise ApiError(400, f"Unknown parameter: 'text.{key}'.", "unknown_parameter",
                           param=f"text.{key}")
    if text.get("format") not in (None, {"type": "text"}):
        raise unsupported("text.format", "Only text.format {\"type\": \"text\"} is supported.")
    if body.get("truncation") not in (None, "disabled"):
        raise unsupported("truncation", "Only truncation 'disabled' is supported.")
    if get_int(body, "top_logprobs", 0, 20):
        raise unsupported("top_logprobs", "top_logprobs are not supported.")
    if body.get("service_tier") not in (None, "auto", "default"):
        raise unsupported("service_tier", "Only service_tier 'auto' or 'default' is supported.")
    if get_bool(body, "background"):
        raise ApiError(400, "Background responses are not supported.", "background_not_supported",
                       param="background")
    if get_list(body, "include"):
        raise unsupported("include", "'include' must be empty.")


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid_value("metadata", "'metadata' must be an object of string values.")
    if len(value) > MAX_METADATA:
        raise invalid_value("metadata", f"'metadata' holds at most {MAX_METADATA} pairs.")
    return value


def _reasoning(body: dict[str, Any]) -> dict[str, Any]:
    reasoning = get_object(body, "reasoning") or {}
    for key in reasoning:
        if key not in ("effort", "summary"):
            raise ApiError(400, f"Unknown parameter: 'reasoning.{key}'.", "unknown_parameter",
                           param=f"reasoning.{key}")
    effort = get_str(reasoning, "effort", "reasoning.effort")
    if effort is not None:
        map_effort(effort, "reasoning.effort")
    return {"effort": effort, "summary": get_str(reasoning, "summary", "reasoning.summary")}


def _function(tool: Any, path: str, namespace: str | None) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise invalid_value(path, f"'{path}' must be an object.")
    if tool.get("type") != "function":
        raise unsupported(f"{path}.type", "Only function tools (and namespaces of them) are "
                          "supported.")
    name = get_str(tool, "name", f"{path}.name")
    if not name:
        raise invalid_value(f"{path}.name", "A function tool needs a name.")
    if tool.get("strict") is True:
        raise unsupported(f"{path}.strict", "Strict tools are not supported.")
    function = {"name": flat_name(name, namespace)}
    for key in ("description", "parameters"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tools(value: Any) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """Template function tools (namespaces flattened) and the namespaced names."""
    if value is None:
        return [], {}
    if not isinstance(value, list):
        raise invalid_value("tools", "'tools' must be an array.")
    tools, namespaces = [], {}
    for i, tool in enumerate(value):
        path = f"tools[{i}]"
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            namespace = get_str(tool, "name", f"{path}.name")
            members = get_list(tool, "tools", f"{path}.tools")
            if not namespace or not members:
                raise invalid_value(path, "A namespace needs a name and tools.")
            for j, member in enumerate(members):
                tools.append(_function(member, f"{path}.tools[{j}]", namespace))
                namespaces[tools[-1]["function"]["name"]] = (namespace, member["name"])
        else:
            tools.append(_function(tool, path, None))
    return tools, namespaces


def _apply_tool_choice(tools: list[dict[str, Any]], choice: Any) -> list[dict[str, Any]] | None:
    """The tools the template shows: all (`auto`), none (`none`) or the allowed ones."""
    if choice == "none":
        return None
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        if choice.get("mode", "auto") != "auto":
            raise unsupported("tool_choice.mode", "Only allowed_tools mode 'auto' is supported.")
        allowed = get_list(choice, "tools", "tool_choice.tools") or []
        names = {flat_name(t.get("name", ""), t.get("namespace")) for t in allowed
                 if isinstance(t, dict)}
        tools = [t for t in tools if t["function"]["name"] in names]
    elif choice in ("required",) or isinstance(choice, dict):
        raise unsupported("tool_choice", "Only tool_choice 'auto', 'none' or allowed_tools "
                          "(mode 'auto') is supported.")
    elif choice not in (None, "auto"):
        raise invalid_value("tool_choice", "'tool_choice' must be 'auto', 'none' or allowed_tools.")
    return tools or None


def check_model(model: str | None, served: str, required: bool) -> None:
    """`model` must be the public id (required on create, optional on input_tokens)."""
    if model is None and required:
        raise ApiError(400, "Missing required parameter: 'model'.", "missing_required_parameter",
                       param="model")
    if model is not None and model != served:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves '{served}'.",
                       "model_not_found", param="model")
