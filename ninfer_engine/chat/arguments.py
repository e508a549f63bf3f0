"""Tool-call arguments typed by the tool's JSON schema (contract §8; no constrained decoding).

A value the model wrote as text becomes the schema's primitive type when it reads as one:
`integer`, `number`, `boolean`, `null`, and `object`/`array` parsed as JSON. Anything else,
including a value that does not fit its declared type, stays the string the model wrote.
"""
from __future__ import annotations

import json
import math
from typing import Any

_NON_STRING = ("integer", "number", "boolean", "null", "object", "array")


def schemas_by_name(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`{function name: parameters schema}` of OpenAI-shaped function tools."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            out[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return out


def coerce_arguments(
    arguments: dict[str, Any], schema: dict[str, Any], raw_strings: bool
) -> dict[str, Any]:
    """Type each string value by its property's schema.

    `raw_strings`: every value is model text (the XML form), so an untyped property stays a
    string; otherwise (JSON) only string values the schema types otherwise are converted.
    """
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    typed = {}
    for key, value in arguments.items():
        if isinstance(value, str) and (raw_strings or key in properties):
            value = convert(value, declared_types(properties.get(key)))
        typed[key] = value
    return typed


def declared_types(schema: Any) -> list[str]:
    """The primitive types a property schema allows (`type`, a list of them, `anyOf`/`oneOf`)."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    types = [kind] if isinstance(kind, str) else [t for t in kind or [] if isinstance(t, str)]
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            types += declared_types(option)
    return types


def convert(text: str, types: list[str]) -> Any:
    """`text` as the first non-string type it reads as; else `text` unchanged."""
    for kind in _NON_STRING:
        if kind in types:
            ok, value = _read(kind, text.strip())
            if ok:
                return value
    return text


def _read(kind: str, text: str) -> tuple[bool, Any]:
    if kind == "boolean":
        lowered = text.lower()
        return lowered in ("true", "false"), lowered == "true"
    if kind == "null":
        return text.lower() == "null", None
    try:
        value = json.loads(text)
    except ValueError:
        return False, None
    if kind == "object":
        return isinstance(value, dict), value
    if kind == "array":
        return isinstance(value, list), value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False, None  # json.loads accepts NaN and Infinity, which JSON output cannot hold
    if kind == "integer":
        if isinstance(value, float) and not value.is_integer():
            return False, None
        return True, int(value)
    return True, value
