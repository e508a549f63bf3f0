"""`tool_choice` that forces a call (`required`, a named tool), `strict` tools and custom tools
with a grammar under `tool_choice: auto` (free text or a call whose input the grammar holds to
the tool's schema or grammar), and `response_format` / `text.format` that force JSON, turned
into one llguidance grammar per request.

The grammar is built while parsing (a schema the library refuses is a 400 naming the field) and
compiled per generation in `prompt.prepare()`, where the engine's tokenizer is known.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.constrained import (
    GrammarError,
    custom_input_grammar,
    json_object_grammar,
    json_schema_grammar,
    optional_call_grammar,
    tool_call_grammar,
)
from ninfer_engine.constrained.grammar import ToolSpec

from .errors import invalid_value


@dataclass(frozen=True)
class ForcedCall:
    """A call the output must be: to one of `names` (None: any offered tool); `once`: exactly
    one call whatever `parallel_tool_calls` says (OpenAI's named `tool_choice`, "call exactly
    one specific function"; Anthropic's `tool` choice may still call it in parallel)."""

    names: frozenset[str] | None = None
    once: bool = False


def tool_specs(tools: list[dict[str, Any]] | None, strict: frozenset[str] = frozenset(),
               grammars: dict[str, str] | None = None) -> list[ToolSpec]:
    """Template function tools -> the grammar's tool list (`strict` names keep their schema
    exactly; others fall back to any object when the library cannot compile theirs;
    `grammars`: custom tools' input grammars by template name)."""
    specs = []
    for tool in tools or []:
        function = tool["function"]
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or not parameters:
            parameters = {"type": "object"}
        name = function["name"]
        specs.append(ToolSpec(name, parameters, name in strict, (grammars or {}).get(name)))
    return specs


def call_grammar(forced: ForcedCall, tools: list[dict[str, Any]] | None, parallel: bool,
                 strict: frozenset[str], param: str,
                 grammars: dict[str, str] | None = None) -> str:
    """The grammar of a forced call; 400 on `param` when no offered tool can be called."""
    specs = [s for s in tool_specs(tools, strict, grammars)
             if forced.names is None or s.name in forced.names]
    if not specs:
        wanted = "a tool" if forced.names is None else f"tool {sorted(forced.names)[0]!r}"
        raise invalid_value(param, f"'{param}' requires {wanted}, but no such tool is offered.")
    try:
        return tool_call_grammar(specs, parallel and not forced.once)
    except GrammarError as exc:
        raise invalid_value(param, f"Cannot force this tool call: {exc}") from None


def auto_grammar(tools: list[dict[str, Any]] | None, parallel: bool, strict: frozenset[str],
                 grammars: dict[str, str] | None = None, answer: str | None = None
                 ) -> str | None:
    """`tool_choice: auto`: None unless an offered tool is `strict` or has an input grammar;
    then free text (or `answer`, the response format's grammar) or calls whose input matches
    the called tool. A strict schema the library cannot compile is a 400 on `tools`."""
    specs = tool_specs(tools, strict, grammars)
    if not any(s.strict or s.grammar is not None for s in specs):
        return None
    try:
        return optional_call_grammar(specs, parallel, answer)
    except GrammarError as exc:
        raise invalid_value("tools", f"Cannot constrain these tools' calls: {exc}") from None


def input_grammar(fmt: Any, param: str) -> str | None:
    """A custom tool's `format` -> its input grammar (None: free text)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid_value(param, f"'{param}' must be an object.")
    if fmt.get("type") == "text":
        return None
    if fmt.get("type") != "grammar":
        raise invalid_value(f"{param}.type", f"'{param}.type' must be 'text' or 'grammar'.")
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if not isinstance(syntax, str) or not isinstance(definition, str):
        raise invalid_value(param, f"'{param}' needs a 'syntax' and a 'definition' string.")
    if syntax not in ("lark", "regex"):
        raise invalid_value(f"{param}.syntax", f"'{param}.syntax' must be 'lark' or 'regex'.")
    try:
        return custom_input_grammar(syntax, definition)
    except GrammarError as exc:
        raise invalid_value(f"{param}.definition", f"The grammar cannot be enforced: {exc}") \
            from None


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


def anthropic_format_grammar(body: dict[str, Any]) -> tuple[str | None, str]:
    """Anthropic structured outputs: `output_config.format` (or the beta's top-level
    `output_format`) `{"type": "json_schema", "schema": ...}` -> its grammar and the field's
    name (None: free text). Anthropic enforces the schema, so it is compiled strict."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    param = "output_config.format" if fmt is not None else "output_format"
    fmt = body.get("output_format") if fmt is None else fmt
    if fmt is None:
        return None, param
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema"
            and isinstance(fmt.get("schema"), dict)):
        raise invalid_value(param, f"'{param}' must be {{\"type\": \"json_schema\", "
                            "\"schema\": {...}}.")
    return format_grammar({"type": "json_schema", "schema": fmt["schema"], "strict": True},
                          param), param
