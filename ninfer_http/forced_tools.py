"""`tool_choice` that forces a call (`required`, a named tool) and `response_format` /
`text.format` that force JSON, turned into one llguidance grammar per request.

The grammar is built while parsing (a schema the library refuses is a 400 naming the field) and
compiled per generation in `prompt.prepare()`, where the engine's tokenizer is known.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.constrained import (
    GrammarError,
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
)
from ninfer_engine.constrained.grammar import ToolSpec

from .errors import invalid_value


@dataclass(frozen=True)
class ForcedCall:
    """A call the output must be: to one of `names` (None: any offered tool)."""

    names: frozenset[str] | None = None


def tool_specs(tools: list[dict[str, Any]] | None, strict: frozenset[str] = frozenset()
               ) -> list[ToolSpec]:
    """Template function tools -> the grammar's tool list (`strict` names keep their schema
    exactly; others fall back to any object when the library cannot compile theirs)."""
    specs = []
    for tool in tools or []:
        function = tool["function"]
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or not parameters:
            parameters = {"type": "object"}
        specs.append(ToolSpec(function["name"], parameters, function["name"] in strict))
    return specs


def call_grammar(forced: ForcedCall, tools: list[dict[str, Any]] | None, parallel: bool,
                 strict: frozenset[str], param: str) -> str:
    """The grammar of a forced call; 400 on `param` when no offered tool can be called."""
    specs = [s for s in tool_specs(tools, strict)
             if forced.names is None or s.name in forced.names]
    if not specs:
        wanted = "a tool" if forced.names is None else f"tool {sorted(forced.names)[0]!r}"
        raise invalid_value(param, f"'{param}' requires {wanted}, but no such tool is offered.")
    try:
        return tool_call_grammar(specs, parallel)
    except GrammarError as exc:
        raise invalid_value(param, f"Cannot force this tool call: {exc}") from None


def format_grammar(fmt: dict[str, Any], param: str) -> str | None:
    """`response_format` / `text.format` -> a grammar (None for plain text)."""
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise invalid_value(f"{param}.type", f"'{param}.type' must be 'text', 'json_object' or "
                            "'json_schema'.")
    # Chat nests the schema under `json_schema`; Responses' text.format holds it directly.
    spec = fmt.get("json_schema", fmt)
    if not isinstance(spec, dict):
        raise invalid_value(f"{param}.json_schema", f"'{param}.json_schema' must be an object.")
    schema = spec.get("schema")
    if schema is None:
        schema = {}  # OpenAI: a json_schema without a schema allows any JSON
    if not isinstance(schema, dict):
        raise invalid_value(f"{param}.schema", "The JSON schema must be an object.")
    strict = spec.get("strict") is True
    try:
        return json_schema_grammar(schema, strict)
    except GrammarError as exc:
        raise invalid_value(f"{param}.schema", f"The JSON schema cannot be enforced: {exc}") \
            from None
