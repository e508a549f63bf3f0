"""Incremental extraction of `<tool_call>…</tool_call>` blocks from decoded answer text.

Two bodies are understood: Hermes JSON (`{"name": …, "arguments": {…}}`, Qwen3) and the
Qwen3.5/Qwen3-Coder XML form (`<function=NAME>` with `<parameter=ARG>VALUE</parameter>` lines).
Text that could still become `<tool_call>` is held back and released as text once it cannot;
a block that does not parse is released as text too, so nothing the model wrote is lost, and so
is a call still open when the output was cut at its token limit (`flush(truncated=True)`).
A JSON call ends at the first `</tool_call>` outside its strings: an argument may hold the tag
(a forced call's grammar allows any string). If the output ends before such a tag, the call
ends at the first tag after all, as a malformed call always did.
Arguments are typed by the tool's JSON schema (see `arguments.py`). Blank text that only
separates calls from each other or from the preceding text is dropped.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Union

from .arguments import coerce_arguments, schemas_by_name
from .reasoning import partial_suffix

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as a string


Item = Union[str, ToolCall]  # answer text, or one complete call


class ToolCallParser:
    """`feed(text)` / `flush()` -> answer text pieces and complete `ToolCall`s, in order.

    `tools` are OpenAI-shaped function tools (`{"type": "function", "function": {...}}`);
    their `parameters` schemas type the arguments.
    """

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._schemas = schemas_by_name(tools or [])
        self._text = ""  # answer text not yet released (a possible "<tool_call>" start, blanks)
        self._call: str | None = None  # the body of an open call, after "<tool_call>"
        self._end = _CallEnd()  # finds the open call's "</tool_call>"
        self._gap = ""  # blanks before the open call: dropped unless the call is malformed
        self._lstrip = False  # drop the blanks after a call
        self._calls = 0

    def feed(self, text: str) -> list[Item]:
        out: list[Item] = []
        if self._call is None:
            self._text += text
        else:
            self._call += text
        while True:
            if self._call is None:
                if not self._scan_text(out):
                    return out
            elif not self._scan_call(out):
                return out

    def flush(self, truncated: bool = False) -> list[Item]:
        """The end of the output: an unclosed call is kept only if its body is complete and
        the output ended on its own. When it was cut (`truncated`: the output or context limit
        was reached) an unclosed call is released as text even if its body happens to parse:
        the model never closed it, so it is not presented as a call a client could run."""
        out: list[Item] = []
        while self._call is not None:
            call = None if truncated else self._parse(self._call)
            if call is not None:
                self._emit_call(out, call)
                self._call = None
            elif CLOSE in self._call:
                # Its JSON never ended (an unbalanced quote): the first tag, though inside a
                # "string", ends this malformed call, and what follows it is read on.
                self._close(out, self._call.find(CLOSE))
                out += self.feed("")
            else:
                self._release(out, OPEN + self._call)
                self._call = None
        if self._text and (self._text.strip() or not self._calls):
            out.append(self._text)
        self._text = ""
        return out

    def _scan_text(self, out: list[Item]) -> bool:
        """Release text before a call; True when a call has just opened."""
        if self._lstrip:
            self._text = self._text.lstrip()
            if not self._text:
                return False
            self._lstrip = False
        start = self._text.find(OPEN)
        if start >= 0:
            before = self._text[:start]
            body = before.rstrip()
            if body:
                out.append(body)
            self._gap = before[len(body):]
            self._call, self._text = self._text[start + len(OPEN):], ""
            self._end = _CallEnd()
            return True
        keep = partial_suffix(self._text, OPEN)
        ready = self._text[:len(self._text) - keep]
        body = ready.rstrip()  # trailing blanks wait: dropped if a call follows them
        if body:
            out.append(body)
            self._text = self._text[len(body):]
        return False

    def _scan_call(self, out: list[Item]) -> bool:
        """Close the open call; True when it has closed."""
        assert self._call is not None
        end = self._end.find(self._call)
        if end < 0:
            return False
        self._close(out, end)
        return True

    def _close(self, out: list[Item], end: int) -> None:
        """End the open call at the `</tool_call>` that starts at `end`."""
        assert self._call is not None
        body, rest = self._call[:end], self._call[end + len(CLOSE):]
        self._call = None
        call = self._parse(body)
        if call is not None:
            self._emit_call(out, call)
            self._text, self._lstrip = rest, True
            return
        restart = body.rfind(OPEN)
        if restart >= 0:
            # The model abandoned a call and began another: only the abandoned part is text.
            self._release(out, OPEN + body[:restart])
            self._text = body[restart:] + CLOSE + rest
        else:
            self._release(out, OPEN + body + CLOSE)
            self._text = rest

    def _emit_call(self, out: list[Item], call: ToolCall) -> None:
        self._calls += 1
        self._gap = ""
        out.append(call)

    def _release(self, out: list[Item], raw: str) -> None:
        # A malformed block is answer text: it reaches the client as the model wrote it.
        out.append(self._gap + raw)
        self._gap = ""

    def _parse(self, body: str) -> ToolCall | None:
        stripped = body.strip()
        if stripped.startswith("{"):
            return self._parse_json(stripped)
        if stripped.startswith("<function="):
            return self._parse_xml(stripped)
        return None

    def _parse_json(self, body: str) -> ToolCall | None:
        try:
            data = json.loads(body, parse_constant=_reject_constant)
        except ValueError:
            return None
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str) or not name:
            return None
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments, parse_constant=_reject_constant) \
                    if arguments.strip() else {}
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return self._call_of(name, arguments, raw_strings=False)

    def _parse_xml(self, body: str) -> ToolCall | None:
        match = _FUNCTION.fullmatch(body)
        if match is None:
            return None
        name, inner = match.group(1).strip(), match.group(2)
        arguments: dict[str, Any] = {}
        end = 0
        for parameter in _PARAMETER.finditer(inner):
            if inner[end:parameter.start()].strip():
                return None  # stray text between parameters: not a well-formed call
            arguments[parameter.group(1).strip()] = parameter.group(2)
            end = parameter.end()
        if inner[end:].strip() or not name:
            return None
        return self._call_of(name, arguments, raw_strings=True)

    def _call_of(self, name: str, arguments: dict[str, Any], raw_strings: bool) -> ToolCall:
        typed = coerce_arguments(arguments, self._schemas.get(name, {}), raw_strings)
        return ToolCall(name, json.dumps(typed, ensure_ascii=False))


class _CallEnd:
    """Finds `</tool_call>` in a call body that grows a token at a time, reading each character
    once. In a JSON body (its first non-blank is `{`) a tag inside a string is no end."""

    def __init__(self) -> None:
        self._searched = 0  # where the tag may start, at the earliest
        self._json: bool | None = None  # unknown until the body's first non-blank character
        self._quoted = False  # inside a JSON string
        self._escaped = False  # just after a backslash in a JSON string

    def find(self, call: str) -> int:
        """Where the tag starts in `call` (the body so far), or -1 while it has not come."""
        if self._json is None:
            first = len(call) - len(call.lstrip())
            if first == len(call):
                return -1
            self._json = call[first] == "{"
        if not self._json:
            end = call.find(CLOSE, self._searched)
            if end < 0:
                self._searched = max(0, len(call) - len(CLOSE) + 1)
            return end
        i = self._searched
        while i < len(call):
            char = call[i]
            if self._escaped:
                self._escaped = False
            elif self._quoted:
                self._escaped = char == "\\"
                self._quoted = char != '"'
            elif char == '"':
                self._quoted = True
            elif char == "<" and call.startswith(CLOSE, i):
                return i
            elif char == "<" and CLOSE.startswith(call[i:]):
                break  # the tag may be arriving: read it again with the next text
            i += 1
        self._searched = i
        return -1


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; a call holding them is malformed.
    raise ValueError(name)
