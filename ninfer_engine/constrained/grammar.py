"""llguidance grammars for what clients constrain: a JSON schema, any JSON object, tool calls.

Each builder returns a grammar string that `LLMatcher` accepts, already validated, or raises
`GrammarError` naming what the library refused. Tool calls use the Hermes form the output parser
reads (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`), whatever template the
model has: the grammar forces the call, the parser reads it back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import llguidance

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
# Fixed separators and no free whitespace: a small model sampled at temperature 1 can otherwise
# spend its whole output on the blanks a flexible JSON grammar allows between tokens.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A schema or grammar the library cannot compile (the client's to fix)."""


@dataclass(frozen=True)
class ToolSpec:
    """One callable tool: its name and the JSON schema of its arguments object."""

    name: str
    parameters: dict[str, Any]
    strict: bool = False


def _checked(grammar: str, what: str) -> str:
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise GrammarError(f"{what}: {messages[0] if messages else 'invalid grammar'}")
    return grammar


def styled(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """`schema` with the output style (JSON_STYLE) as llguidance's own `x-guidance` options;
    a non-strict schema's keywords the library does not implement are ignored, not refused."""
    options = {**JSON_STYLE, **({} if strict else {"lenient": True}),
               **(schema.get("x-guidance") or {})}
    return {**schema, "x-guidance": options}


def json_schema_grammar(schema: dict[str, Any], strict: bool = True) -> str:
    """Output that is one JSON value valid under `schema`."""
    if not isinstance(schema, dict):
        raise GrammarError("the JSON schema must be an object")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(styled(schema, strict))
    except ValueError as exc:
        raise GrammarError(f"the JSON schema is not usable: {exc}") from None
    return _checked(grammar, "the JSON schema is not usable")


def json_object_grammar() -> str:
    """Output that is one JSON object (`response_format: json_object`)."""
    return json_schema_grammar({"type": "object"})


_DEFS = ("$defs", "definitions")


def _call_schema(tool: ToolSpec) -> dict[str, Any]:
    """`{"name": <tool>, "arguments": <its schema>}`; the schema's `$defs` move to the root,
    where its `#/$defs/...` references (Pydantic's) point."""
    arguments = {k: v for k, v in tool.parameters.items() if k not in _DEFS}
    schema = {"type": "object", "properties": {"name": {"const": tool.name},
                                               "arguments": arguments},
              "required": ["name", "arguments"], "additionalProperties": False}
    return {**schema, **{k: tool.parameters[k] for k in _DEFS if k in tool.parameters}}


def _one_of(options: list[dict[str, Any]]) -> dict[str, Any]:
    """One schema for several calls, every option's definitions at its root."""
    if len(options) == 1:
        return options[0]
    roots = {key: {} for key in _DEFS}
    for option in options:
        for key in _DEFS:
            roots[key].update(option.pop(key, {}))
    return {"anyOf": options, **{k: v for k, v in roots.items() if v}}


def _arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """The tool's schema when the library takes it; a non-strict tool falls back to any object
    (its arguments are then typed by the parser only), a strict one is refused."""
    try:
        json_schema_grammar(_call_schema(tool))
        return tool.parameters
    except GrammarError as exc:
        if tool.strict:
            raise GrammarError(f"tool {tool.name!r}: {exc}") from None
        return {"type": "object"}


def tool_call_grammar(tools: list[ToolSpec], parallel: bool) -> str:
    """Output that is one tool call (or, when `parallel`, one or more) to one of `tools`."""
    if not tools:
        raise GrammarError("a tool call is required but no tool is offered")
    options = [_call_schema(ToolSpec(t.name, _arguments_schema(t), t.strict)) for t in tools]
    body = styled(_one_of(options))
    calls = 'call ("\\n" call)*' if parallel else "call"
    lark = (f"start: {calls}\n"
            f"call: {json.dumps(OPEN)} body {json.dumps(CLOSE)}\n"
            f"body: %json {json.dumps(body)}\n")
    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), "tool call grammar")
