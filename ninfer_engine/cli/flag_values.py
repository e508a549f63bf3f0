"""`UsageError` and the value converters of `ninfer-serve`'s flag table.

Each converter takes the flag and its raw text and returns the value, or raises a one-line
`UsageError` naming the flag.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


class UsageError(Exception):
    """A bad command line or environment: one line; the CLI prints it with usage, exit 1."""


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, str], int]:
    def conv(flag: str, raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            raise UsageError(f"{flag}: expected an integer, got {raw!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
            raise UsageError(f"{flag}: {value} is out of range {bounds}")
        return value

    return conv


def _float(lo: float, hi: float, lo_open: bool = False) -> Callable[[str, str], float]:
    def conv(flag: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{flag}: expected a number, got {raw!r}") from None
        if value != value or value > hi or value < lo or (lo_open and value == lo):
            left = "(" if lo_open else "["
            raise UsageError(f"{flag}: {raw} is out of range {left}{lo}, {hi}]")
        return value

    return conv


def _choice(*choices: str) -> Callable[[str, str], str]:
    def conv(flag: str, raw: str) -> str:
        if raw not in choices:
            raise UsageError(f"{flag}: {raw!r} is not one of {', '.join(choices)}")
        return raw

    return conv


def _text(flag: str, raw: str) -> str:
    if not raw.strip():
        raise UsageError(f"{flag}: must not be empty")
    return raw


def _path(flag: str, raw: str) -> Path:
    return Path(_text(flag, raw)).expanduser()


def _devices(flag: str, raw: str) -> tuple[int, ...]:
    parts = raw.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"{flag}: expected two device indices A,B, got {raw!r}")
    a, b = (int(p) for p in parts)
    if a == b:
        raise UsageError(f"{flag}: the two devices must differ, got {raw!r}")
    return (a, b)


def _kv_capacity(flag: str, raw: str) -> int | str:
    return "auto" if raw == "auto" else _int(1)(flag, raw)


def _prefill_chunk(flag: str, raw: str) -> int | None:
    return None if raw == "auto" else _int(1)(flag, raw)


def _or_auto(parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """`auto`, or what `parse` makes of the value."""
    return lambda flag, raw: "auto" if raw == "auto" else parse(flag, raw)


def _positive_float(flag: str, raw: str) -> float:
    return _float(0.0, float("inf"), lo_open=True)(flag, raw)
