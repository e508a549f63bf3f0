"""The per-request `OutputSplitter`: engine text -> reasoning, answer content and tool calls.

`<think>` splitting always runs (it starts inside reasoning when the prompt opened a think
block); tool-call extraction runs on the answer when the request offered tools. Tool markup in
the reasoning stays reasoning. Complete calls are held until `flush()`, so every protocol sees
the contract's order (reasoning, content, held-back content, then all calls) without
reordering: Chat's one `tool_calls` chunk, Anthropic's `tool_use` blocks after the text and
Responses' `function_call` items after the message.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ninfer_engine.chat.reasoning import CONTENT, ReasoningSplitter
from ninfer_engine.chat.tool_calls import ToolCall, ToolCallParser

from .prompt import PreparedRequest


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as a string, typed by the tool's schema


@dataclass(frozen=True)
class OutputDelta:
    channel: str  # "content" | "reasoning" | "tool_call"
    text: str = ""
    tool_call: ParsedToolCall | None = None  # set when channel == "tool_call" (complete call)


class OutputSplitter(Protocol):
    """Splits the engine's text stream into channels before a protocol formats it."""

    @property
    def in_reasoning(self) -> bool:
        """True while the text fed next belongs to the reasoning (for `reasoning_tokens`)."""
        ...

    def feed(self, text: str) -> list[OutputDelta]: ...

    def flush(self, truncated: bool = False) -> list[OutputDelta]:
        """Whatever was held back, then every tool call, once generation has finished;
        `truncated` (it ended at a token limit): a call still open is text, not a call."""
        ...


class ParsedOutput:
    """Reasoning and (when `tools` is set) tool-call parsing over one generation's text."""

    def __init__(self, opened_thinking: bool, tools: list[dict[str, Any]] | None,
                 parallel_tool_calls: bool = True) -> None:
        self._reasoning = ReasoningSplitter(opened=opened_thinking)
        self._tools = ToolCallParser(tools) if tools else None
        self._calls: list[OutputDelta] = []
        self._max_calls = None if parallel_tool_calls else 1  # `parallel_tool_calls: false`

    @property
    def in_reasoning(self) -> bool:
        return self._reasoning.in_reasoning

    def feed(self, text: str) -> list[OutputDelta]:
        return self._split(self._reasoning.feed(text), final=False)

    def flush(self, truncated: bool = False) -> list[OutputDelta]:
        deltas = self._split(self._reasoning.flush(), final=True, truncated=truncated)
        calls, self._calls = self._calls, []
        return deltas + calls

    def _split(self, pieces: list[tuple[str, str]], final: bool, truncated: bool = False
               ) -> list[OutputDelta]:
        out: list[OutputDelta] = []
        for channel, text in pieces:
            if channel == CONTENT and self._tools is not None:
                self._answer(self._tools.feed(text), out)
            else:
                out.append(OutputDelta(channel, text))
        if final and self._tools is not None:
            self._answer(self._tools.flush(truncated), out)
        return out

    def _answer(self, items: list[str | ToolCall], out: list[OutputDelta]) -> None:
        for item in items:
            if isinstance(item, ToolCall):
                if self._max_calls is not None and len(self._calls) >= self._max_calls:
                    continue  # one call per turn was asked for: later ones are dropped
                call = ParsedToolCall(item.name, item.arguments)
                self._calls.append(OutputDelta("tool_call", tool_call=call))
            else:
                out.append(OutputDelta("content", item))


def output_splitter(prepared: PreparedRequest) -> ParsedOutput:
    """The splitter for one prepared request."""
    return ParsedOutput(prepared.opens_thinking, prepared.tools, prepared.parallel_tool_calls)
