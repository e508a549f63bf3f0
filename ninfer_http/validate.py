"""Typed field readers for JSON request bodies: each failure is a 400 naming the field path.

JSON `true`/`false` are Python ints; every numeric reader rejects them explicitly.
"""
from __future__ import annotations

import json
import math
from typing import Any

from .errors import ApiError, invalid_value, missing

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be one JSON object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", "invalid_json")
    return body


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def require(body: dict[str, Any], key: str, param: str | None = None) -> Any:
    """The value of a required field; absent or null is `missing_required_parameter`."""
    if body.get(key) is None:
        raise missing(param or key)
    return body[key]


def get_str(body: dict[str, Any], key: str, param: str | None = None) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid_value(param or key, f"'{param or key}' must be a string.")
    return value


def get_bool(body: dict[str, Any], key: str, param: str | None = None) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid_value(param or key, f"'{param or key}' must be a boolean.")
    return value


def get_int(
    body: dict[str, Any],
    key: str,
    low: int | None = None,
    high: int | None = None,
    param: str | None = None,
) -> int | None:
    """An optional integer in [low, high]; floats with an integral value are accepted."""
    name = param or key
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise invalid_value(name, f"'{name}' must be an integer.")
    _check_range(name, value, low, high)
    return value


def get_number(
    body: dict[str, Any],
    key: str,
    low: float | None = None,
    high: float | None = None,
    param: str | None = None,
) -> float | None:
    """An optional finite number in [low, high]."""
    name = param or key
    value = body.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise invalid_value(name, f"'{name}' must be a number.")
    _check_range(name, value, low, high)
    return float(value)


def get_object(body: dict[str, Any], key: str, param: str | None = None) -> dict[str, Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise invalid_value(param or key, f"'{param or key}' must be an object.")
    return value


def get_list(body: dict[str, Any], key: str, param: str | None = None) -> list[Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, list):
        raise invalid_value(param or key, f"'{param or key}' must be an array.")
    return value


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise invalid_value(name, f"'{name}' must be in {bounds}; got {value}.")
