"""Anthropic Messages request body -> `ChatRequest` (contract §7 "Request").

The conversation's content blocks are `anthropic_conversation`'s; this module reads the rest:
tools, `tool_choice`, output format, stop sequences, sampling and thinking. `thinking.display`
"omitted" is returned beside the request: only the reply's thinking blocks depend on it.
"""
from __future__ import annotations

from typing import Any

from ninfer_engine.client import ServingEngine
from ninfer_engine.config import EngineConfig

from .anthropic_conversation import Conversation, check_cache_control
from .errors import invalid_value, unsupported
from .forced_tools import ForcedCall, anthropic_format_grammar, auto_grammar, call_grammar
from .openai_fields import sampling_overrides
from .prompt import ChatRequest, map_effort
from .validate import get_bool, get_int, get_list, get_object, get_str, parse_json_object, require


def parse_messages_request(
    raw: bytes, engine: ServingEngine, config: EngineConfig, counting: bool = False
) -> tuple[ChatRequest, str, bool]:
    """The parsed request, the `model` label to echo, and whether thinking display is omitted.
    `counting` (count_tokens, whose body has no `max_tokens`): `budget_tokens` is not held
    against an output limit."""
    body = parse_json_object(raw)
    model = require(body, "model")
    if not isinstance(model, str):
        raise invalid_value("model", "'model' must be a string.")
    max_tokens = get_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise invalid_value("max_tokens", "'max_tokens' must be at least 1.")
    if body.get("mcp_servers"):
        raise unsupported("mcp_servers", "MCP servers are not supported.")
    parser = Conversation()
    parser.system(body.get("system"))
    parser.messages(require(body, "messages"))
    tools = _tools(body.get("tools"), parser)
    kind, forced, parallel = _tool_choice(body.get("tool_choice"))
    if kind == "none":
        tools = None
    strict = _strict_names(body.get("tools"))
    answer, answer_param = anthropic_format_grammar(body)
    if forced is not None:
        if answer is not None:
            raise invalid_value(answer_param, f"'{answer_param}' cannot constrain an answer "
                                "that tool_choice forces to be a tool call.")
        grammar, param = call_grammar(forced, tools, parallel, strict, "tool_choice"), "tool_choice"
    else:  # strict tools' calls match their input_schema; the answer its format, if any
        grammar, param = auto_grammar(tools, parallel, strict, answer=answer), "tools"
        if grammar is None:
            grammar, param = answer, answer_param
    if body.get("cache_control") is not None:
        check_cache_control(body["cache_control"], "cache_control")
    stop = get_list(body, "stop_sequences") or []
    if not all(isinstance(s, str) for s in stop):
        raise invalid_value("stop_sequences", "'stop_sequences' must be an array of strings.")
    limit = None if counting else max_tokens or engine.default_max_tokens
    kwargs, thinking, budget = _thinking(body, config, limit)
    if parser.prefill and kwargs.get("enable_thinking") is True:
        raise invalid_value("messages", "An assistant prefill needs thinking to be disabled.")
    if parser.prefill:
        kwargs["enable_thinking"] = False  # the prefill continues the answer, not a thought
        thinking = "off"
    request = ChatRequest(
        protocol="anthropic",
        messages=parser.out,
        tools=tools,
        max_tokens=max_tokens,
        sampling=sampling_overrides({k: body.get(k) for k in ("temperature", "top_p", "top_k")},
                                    top_k_max=None),
        stop=tuple(s for s in stop if s),
        template_kwargs=kwargs,
        stream=bool(get_bool(body, "stream")),
        thinking=thinking,
        prefill=parser.prefill,
        thinking_budget=budget,
        grammar=grammar,
        grammar_param=param,
        parallel_tool_calls=parallel,
        breakpoints=tuple(parser.marked),
    )
    return request, model, _display_omitted(body)


def _tool_choice(choice: Any) -> tuple[str, ForcedCall | None, bool]:
    """`tool_choice` -> its type, the call it forces (`any`: to some tool, `tool`: to the named
    one; compiled by forced_tools like Chat's) and whether several calls may come back
    (`disable_parallel_tool_use`)."""
    if choice is None:
        return "auto", None, True
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid_value("tool_choice.type",
                            "tool_choice.type must be 'auto', 'any', 'tool' or 'none'.")
    parallel = get_bool(choice, "disable_parallel_tool_use",
                        "tool_choice.disable_parallel_tool_use") is not True
    if kind == "any":
        return kind, ForcedCall(), parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid_value("tool_choice.name", "tool_choice 'tool' needs a 'name'.")
        return kind, ForcedCall(frozenset({name})), parallel
    return kind, None, parallel


def _tools(tools: Any, parser: Conversation) -> list[dict[str, Any]] | None:
    """Client tools as OpenAI-shaped function tools for the template."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid_value("tools", "'tools' must be an array.")
    converted = []
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_value(path, f"'{path}' must be an object.")
        if tool.get("type") not in (None, "custom"):
            raise unsupported(f"{path}.type", "Server tools are not supported.")
        get_bool(tool, "strict", f"{path}.strict")
        parser.cache_breakpoint(tool, path, system=True)
        if not isinstance(tool.get("name"), str):
            raise invalid_value(f"{path}.name", "A tool needs a name.")
        function = {"name": tool["name"],
                    "parameters": get_object(tool, "input_schema", f"{path}.input_schema") or {}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted or None


def _strict_names(tools: Any) -> frozenset[str]:
    """The names of the `strict: true` tools (checked by `_tools`)."""
    return frozenset(t["name"] for t in tools or [] if t.get("strict") is True)


def _display_omitted(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    display = thinking.get("display") if isinstance(thinking, dict) else None
    if display not in (None, "summarized", "omitted"):
        raise invalid_value("thinking.display", "thinking.display is 'summarized' or 'omitted'.")
    return display == "omitted"


def _thinking(
    body: dict[str, Any], config: EngineConfig, max_tokens: int | None
) -> tuple[dict[str, Any], str, int | None]:
    """Template kwargs for `thinking` and `output_config.effort`, the log label, and the
    thinking cap (`budget_tokens`, else `--default-thinking-budget`)."""
    kwargs: dict[str, Any] = {}
    budget = config.default_thinking_budget
    if config.no_thinking:
        kwargs["enable_thinking"] = False
    if config.preserve_thinking:
        kwargs["preserve_thinking"] = True
    label = "off" if config.no_thinking else "default"
    thinking = get_object(body, "thinking")
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("disabled", "enabled", "adaptive"):
            raise invalid_value("thinking.type", "thinking.type is disabled, enabled or adaptive.")
        if kind == "enabled":
            requested = get_int(thinking, "budget_tokens", 1024, param="thinking.budget_tokens")
            if requested is None or (max_tokens is not None and requested >= max_tokens):
                raise invalid_value("thinking.budget_tokens",
                                    "budget_tokens must be >= 1024 and less than max_tokens.")
            budget = requested
        kwargs["enable_thinking"] = kind != "disabled"
        label = "off" if kind == "disabled" else "on"
    effort = get_str(get_object(body, "output_config") or {}, "effort", "output_config.effort")
    if effort is not None and kwargs.get("enable_thinking") is not False:
        level = map_effort(effort, "output_config.effort")
        if level == "off":
            kwargs["enable_thinking"] = False
        else:
            kwargs["reasoning_effort"] = level
        label = level
    return kwargs, label, budget
