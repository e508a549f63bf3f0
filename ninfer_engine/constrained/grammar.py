"""llguidance grammars for what clients constrain: a JSON schema, any JSON object, tool calls.

Each builder returns a grammar string that `LLMatcher` accepts, already validated, or raises
`GrammarError` naming what the library refused. Tool calls use the Hermes form the output parser
reads (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`), whatever template the
model has: the grammar forces the call, the parser reads it back. A custom tool with an input
grammar (Lark, or a regex) is called in the XML form instead
(`<function=NAME>\\n<parameter=input>\\nRAW\\n</parameter>\\n</function>`), so its raw input
follows the client's grammar with no JSON escaping (its grammar is a side grammar, `@name`).
`tool_call_grammar` forces a call; `optional_call_grammar` (tool_choice auto) allows free text
that ends at the first `<tool_call>`, then only calls matching a tool.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import llguidance

CALL_TAG = "<tool_call>"
OPEN, CLOSE = CALL_TAG + "\n", "\n</tool_call>"
# The rules that spell the call tags, as text (any tokenizer) and as the special tokens a
# tokenizer may hold them as (Qwen3.5's `<tool_call>` is one added token): llguidance's mask
# for a tag spelled as text allows the tag's token, which its matcher then refuses, so such a
# tokenizer's grammar names the tokens instead (`with_tag_tokens`, at compile time)
TEXT_TAGS = (f"call_open: {json.dumps(OPEN)}", f"call_close: {json.dumps(CLOSE)}",
             f"call_start[lazy]: TEXT {json.dumps(CALL_TAG)}")
TOKEN_TAGS = ('call_open: <tool_call> "\\n"', 'call_close: "\\n" </tool_call>',
              "call_start: TEXT <tool_call>")
_TOKEN_TAG_OF = dict(zip(TEXT_TAGS, TOKEN_TAGS))
CUSTOM_INPUT = "input"  # a custom tool's one string argument, as the template shows it
CUSTOM_END = "\n</parameter>\n</function>"
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
    grammar: str | None = None  # a custom tool's input grammar (its call is then the XML form)


def _checked(grammar: str, what: str) -> str:
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise GrammarError(f"{what}: {messages[0] if messages else 'invalid grammar'}")
    return grammar


def styled(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """`schema` with the output style (JSON_STYLE) as llguidance's own `x-guidance` options,
    its objects closed (`closed`); a non-strict schema's keywords the library does not
    implement are ignored, not refused."""
    options = {**JSON_STYLE, **({} if strict else {"lenient": True}),
               **(schema.get("x-guidance") or {})}
    return {**closed(schema), "x-guidance": options}


_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on each object that lists `properties` and
    says nothing of others (xgrammar's default strict mode, as vLLM and SGLang serve it): the
    output stays valid, and a small model cannot wander off into keys the schema never named
    (Pydantic's schemas, as LangChain's function_calling sends them, leave objects open)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    if ("properties" in out and "additionalProperties" not in out
            and "patternProperties" not in out and "unevaluatedProperties" not in out):
        out["additionalProperties"] = False
    return out


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


def _side(grammar: str, name: str) -> dict[str, Any]:
    """A grammar (Lark text, or llguidance's `{"grammars": [one]}` JSON) as a named side
    grammar that a Lark rule references as `@name`."""
    if grammar.lstrip().startswith("{"):
        [only] = json.loads(grammar)["grammars"]
        return {**only, "name": name}
    return {"lark_grammar": grammar, "name": name}


def _call_rules(tools: list[ToolSpec], loose: bool = False
                ) -> tuple[list[str], list[dict[str, Any]]]:
    """Lark rules for `call_body` (what stands between `<tool_call>\\n` and `\\n</tool_call>`)
    and the side grammars they reference: function tools as one Hermes JSON object, each
    custom tool with a grammar as the XML form with its raw input, which the output parser
    reads back (`<function=NAME>` / `<parameter=input>`). `loose` (tool_choice auto): a
    non-strict function's arguments are any object, and it may also be called in the XML form
    with free parameters (Qwen3.5's own form), as when nothing was constrained."""
    rules: list[str] = []
    side: list[dict[str, Any]] = []
    alternatives: list[str] = []
    functions = [t for t in tools if t.grammar is None]
    if functions:
        options = [_call_schema(ToolSpec(t.name, t.parameters if t.strict and loose
                                         else {"type": "object"} if loose
                                         else _arguments_schema(t), t.strict))
                   for t in functions]
        rules.append(f"json_call: %json {json.dumps(styled(_one_of(options)))}")
        alternatives.append("json_call")
    free = [t.name for t in functions if loose and not t.strict]
    if free:
        names = " | ".join(json.dumps(f"<function={name}>") for name in free)
        rules += [f"xml_call: ({names}) xml_rest", 'xml_rest[lazy]: TEXT "</function>"']
        alternatives.append("xml_call")
    for i, tool in enumerate(t for t in tools if t.grammar is not None):
        assert tool.grammar is not None
        head = f"<function={tool.name}>\n<parameter={CUSTOM_INPUT}>\n"
        rules.append(f"custom_call_{i}: {json.dumps(head)} @tool_input_{i} "
                     f"{json.dumps(CUSTOM_END)}")
        side.append(_side(tool.grammar, f"tool_input_{i}"))
        alternatives.append(f"custom_call_{i}")
    return ["call_body: " + " | ".join(alternatives), *rules], side


def _compiled(lark: str, side: list[dict[str, Any]], what: str) -> str:
    if side:
        grammar = json.dumps({"grammars": [{"lark_grammar": lark}, *side]})
    else:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    return _checked(grammar, what)


def tool_call_grammar(tools: list[ToolSpec], parallel: bool) -> str:
    """Output that is one tool call (or, when `parallel`, one or more) to one of `tools`."""
    if not tools:
        raise GrammarError("a tool call is required but no tool is offered")
    body, side = _call_rules(tools)
    calls = 'call ("\\n" call)*' if parallel else "call"
    lark = "\n".join([f"start: {calls}", "call: call_open call_body call_close", *TEXT_TAGS[:2],
                      *body]) + "\n"
    return _compiled(lark, side, "tool call grammar")


def optional_call_grammar(tools: list[ToolSpec], parallel: bool,
                          answer: str | None = None) -> str:
    """`tool_choice: auto` with tools whose input is constrained (`strict` functions, custom
    tools with a grammar): the output is free text (or `answer`'s grammar, a response format)
    or, once the model writes `<tool_call>`, text before it and then one call (or, when
    `parallel`, one or more) whose body matches the called tool, nothing after. The text is one
    lazy lexeme that ends at the first `<tool_call>`, as llguidance's structural tags do. Other
    tools' calls stay as free as without a grammar (`_call_rules(loose=True)`)."""
    if not tools:
        raise GrammarError("no tool is offered")
    for tool in tools:  # the library must take a strict tool's schema
        if tool.strict and tool.grammar is None:
            _arguments_schema(tool)
    body, side = _call_rules(tools, loose=True)
    more = ' ("\\n" call)*' if parallel else ""
    if answer is None:
        start = [f"start: TEXT | first_call{more}",
                 f"first_call: call_start {json.dumps(OPEN[len(CALL_TAG):])} call_body "
                 "call_close", TEXT_TAGS[2]]
    else:  # the answer is the format's JSON, or calls without text before them
        start = [f"start: @answer | call{more}"]
        side.append(_side(answer, "answer"))
    lark = "\n".join(["%llguidance {}", *start, "call: call_open call_body call_close",
                      *TEXT_TAGS[:2], *body, "TEXT: /(.|\\n)*/"]) + "\n"
    return _compiled(lark, side, "tool call grammar")


def with_tag_tokens(grammar: str) -> str:
    """`grammar` (a builder's: Lark text, or llguidance's JSON of several) with the call tags'
    rules naming the tags' special tokens (`TOKEN_TAGS`) instead of spelling them."""
    def swapped(lark: str) -> str:
        return "\n".join(_TOKEN_TAG_OF.get(line, line) for line in lark.split("\n"))
    if not grammar.lstrip().startswith("{"):
        return swapped(grammar)
    parsed = json.loads(grammar)
    for one in parsed.get("grammars", []):
        if "lark_grammar" in one:
            one["lark_grammar"] = swapped(one["lark_grammar"])
    return json.dumps(parsed)


def custom_input_grammar(syntax: str, definition: str) -> str:
    """A custom tool's input grammar (`lark`, or a `regex` the whole input matches) as Lark."""
    if syntax == "lark":
        lark = definition
    elif syntax == "regex":
        lark = "start: /" + definition.replace("/", "\\/") + "/\n"
    else:
        raise GrammarError(f"grammar syntax {syntax!r} is not supported (lark or regex)")
    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), f"the {syntax} grammar")
