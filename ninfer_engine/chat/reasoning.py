"""Incremental `<think>…</think>` splitting of decoded model text into reasoning and answer.

Text arrives in arbitrary pieces (a tag may be split across any number of them); nothing that
could still become a tag is released until it is decided. Qwen-style templates open `<think>\n`
in the generation prompt when thinking is on, so the output may start inside reasoning
(`opened=True`); otherwise an output whose first non-blank text is `<think>` opens it. Only the
first think block is parsed: later tags are ordinary answer text. Whitespace that only separates
the tags from the text (after `<think>`, before and after `</think>`) is dropped.
"""
from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"

REASONING = "reasoning"
CONTENT = "content"

_START, _THINKING, _ANSWER = "start", "thinking", "answer"


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningSplitter:
    """`feed(text)` / `flush()` -> `[(channel, text)]` with channel "reasoning" or "content"."""

    def __init__(self, opened: bool = False) -> None:
        self._state = _THINKING if opened else _START
        self._held = ""  # undecided text: a possible tag start, or blanks that may be dropped
        self._lstrip = opened  # drop the blanks that open the next span

    @property
    def in_reasoning(self) -> bool:
        """True while the text fed next belongs to the reasoning."""
        return self._state == _THINKING

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._held += text
        while self._held:
            if self._state == _START and not self._start():
                break
            if self._state == _THINKING and not self._thinking(out):
                break
            if self._state == _ANSWER:
                self._answer(out)
                break
        return out

    def flush(self) -> list[tuple[str, str]]:
        """Release undecided text at the end of the output; a trailing blank tail is dropped."""
        held, self._held = self._held, ""
        if self._state == _START and held:
            return [(CONTENT, held)]  # never opened: whatever it was is answer text
        if self._state == _ANSWER and held.strip():
            return [(CONTENT, held)]
        if self._state == _THINKING and held.strip():
            return [(REASONING, held.rstrip())]
        return []

    def _start(self) -> bool:
        """Decide whether the output opens a think block; False while undecided."""
        body = self._held.lstrip()
        if body.startswith(OPEN):
            self._held = body[len(OPEN):]
            self._state, self._lstrip = _THINKING, True
            return True
        if OPEN.startswith(body):
            return False  # blank, or a prefix of "<think>": wait for more text
        self._state = _ANSWER
        return True

    def _thinking(self, out: list[tuple[str, str]]) -> bool:
        """Emit reasoning up to `</think>`; False while the rest is undecided."""
        if self._lstrip:
            self._held = self._held.lstrip()
            if not self._held:
                return False
            self._lstrip = False
        end = self._held.find(CLOSE)
        if end >= 0:
            reasoning = self._held[:end].rstrip()
            if reasoning:
                out.append((REASONING, reasoning))
            self._held = self._held[end + len(CLOSE):]
            self._state, self._lstrip = _ANSWER, True
            return True
        keep = partial_suffix(self._held, CLOSE)
        ready = self._held[:len(self._held) - keep]
        # Trailing blanks wait: they are dropped if `</think>` follows them.
        body = ready.rstrip()
        if body:
            out.append((REASONING, body))
        self._held = ready[len(body):] + self._held[len(ready):]
        return False

    def _answer(self, out: list[tuple[str, str]]) -> None:
        if self._lstrip:
            self._held = self._held.lstrip()
            if not self._held:
                return
            self._lstrip = False
        out.append((CONTENT, self._held))
        self._held = ""
