"""Output items of one Response, built from the generation's channels (contract §6 "SSE").

`OutputBuilder` consumes `OutputDelta`s in order and returns the semantic SSE events they
produce (payloads without `sequence_number`, which the writer adds): a reasoning item and a
message item are opened on their channel's first text and closed when another channel starts or
generation ends; each complete tool call becomes one `function_call` item whose arguments come
in a single delta (a `custom_tool_call` with its input, or a `local_shell_call`, when the call
is to such a tool). With `seal` set, reasoning items carry `encrypted_content`. With `logprobs`
set (a callable giving the entries of the answer tokens that arrived since its last call), each
`output_text` delta carries its tokens' entries and the message part all of them. The same
builder gives the non-streaming `output`.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .output import OutputDelta, ParsedToolCall
from .responses_shapes import (
    CUSTOM_INPUT,
    custom_call_item,
    function_call_item,
    item_id,
    local_shell_item,
    message_item,
    reasoning_item,
)
from .responses_tools import CallTarget

Event = dict[str, Any]

# channel -> (item type, content part type, delta/done event prefix, id prefix)
_TEXT_ITEMS = {
    "reasoning": ("reasoning", "reasoning_text", "response.reasoning_text", "rs_"),
    "content": ("message", "output_text", "response.output_text", "msg_"),
}


class OutputBuilder:
    """The `output` array and its SSE events; `targets` maps template tool names back to what
    the client offered."""

    def __init__(self, targets: dict[str, CallTarget],
                 seal: Callable[[str], str] | None = None,
                 logprobs: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.targets = targets
        self.seal = seal
        self.logprobs = logprobs
        self._entries: list[dict[str, Any]] = []  # the open message's logprobs
        self.output: list[dict[str, Any]] = []
        self._channel: str | None = None  # the channel of the open text item
        self._id = ""
        self._texts: list[str] = []

    def feed(self, deltas: list[OutputDelta]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.channel == "tool_call":
                assert delta.tool_call is not None  # the splitter sends complete calls
                events += self.close("completed")
                events += self._call(delta.tool_call)
                continue
            if delta.channel != self._channel:
                events += self.close("completed")
                events += self._open(delta.channel)
            self._texts.append(delta.text)
            if delta.channel == "content" and self.logprobs is not None:
                entries = self.logprobs()
                self._entries += entries
                events.append(self._text_event("delta", delta=delta.text, logprobs=entries))
            else:
                events.append(self._text_event("delta", delta=delta.text))
        return events

    def close(self, status: str) -> list[Event]:
        """Finish the open text item; a message ends with `status` (`incomplete` at a limit)."""
        if self._channel is None:
            return []
        kind = _TEXT_ITEMS[self._channel][0]
        text = "".join(self._texts)
        if kind == "reasoning":
            item = reasoning_item(self._id, text, self.seal(text) if self.seal else None)
        else:
            item = message_item(self._id, text, status, self._entries)
        events = [self._text_event("done", text=text, **(
                      {"logprobs": self._entries} if kind == "message" else {})),
                  self._part_event("response.content_part.done", item["content"][0]),
                  self._item_event("response.output_item.done", item)]
        self.output.append(item)
        self._channel = None
        self._texts = []
        self._entries = []
        return events

    def _open(self, channel: str) -> list[Event]:
        kind, part_type, _, prefix = _TEXT_ITEMS[channel]
        self._channel = channel
        self._id = item_id(prefix)
        if kind == "reasoning":
            item: dict[str, Any] = {"id": self._id, "type": "reasoning", "summary": [],
                                    "content": []}
            part: dict[str, Any] = {"type": part_type, "text": ""}
        else:
            item = {"id": self._id, "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            part = {"type": part_type, "text": "", "annotations": [], "logprobs": []}
        return [self._item_event("response.output_item.added", item),
                self._part_event("response.content_part.added", part)]

    def _call(self, call: ParsedToolCall) -> list[Event]:
        target = self.targets.get(call.name, CallTarget("function", call.name))
        arguments = json.loads(call.arguments)  # the parser's output: always a JSON object
        if target.kind == "custom" and isinstance(arguments.get(CUSTOM_INPUT), str):
            return self._custom(target.name, arguments[CUSTOM_INPUT])
        if target.kind == "local_shell" and isinstance(arguments.get("command"), list):
            item = local_shell_item(item_id("lsh_"), item_id("call_"), arguments)
            return self._whole(item, {**item, "status": "in_progress"})
        namespace, name = target.namespace, target.name
        fc_id, call_id = item_id("fc_"), item_id("call_")
        started = function_call_item(fc_id, call_id, name, namespace, "", "in_progress")
        item = function_call_item(fc_id, call_id, name, namespace, call.arguments)
        index = len(self.output)
        return self._whole(item, started, [
            {"type": "response.function_call_arguments.delta", "item_id": fc_id,
             "output_index": index, "delta": call.arguments},
            {"type": "response.function_call_arguments.done", "item_id": fc_id,
             "output_index": index, "name": name, "arguments": call.arguments}])

    def _custom(self, name: str, text: str) -> list[Event]:
        ctc_id, call_id = item_id("ctc_"), item_id("call_")
        started = custom_call_item(ctc_id, call_id, name, "", "in_progress")
        item = custom_call_item(ctc_id, call_id, name, text)
        index = len(self.output)
        return self._whole(item, started, [
            {"type": "response.custom_tool_call_input.delta", "item_id": ctc_id,
             "output_index": index, "delta": text},
            {"type": "response.custom_tool_call_input.done", "item_id": ctc_id,
             "output_index": index, "input": text}])

    def _whole(self, item: dict[str, Any], started: dict[str, Any],
               between: tuple[Event, ...] | list[Event] = ()) -> list[Event]:
        """A complete item: added (as `started`), the events `between`, done."""
        index = len(self.output)
        self.output.append(item)
        return [{"type": "response.output_item.added", "output_index": index, "item": started},
                *between,
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def _item_event(self, kind: str, item: dict[str, Any]) -> Event:
        return {"type": kind, "output_index": len(self.output), "item": item}

    def _part_event(self, kind: str, part: dict[str, Any]) -> Event:
        return {"type": kind, "item_id": self._id, "output_index": len(self.output),
                "content_index": 0, "part": part}

    def _text_event(self, stage: str, **fields: Any) -> Event:
        prefix = _TEXT_ITEMS[self._channel or "content"][2]
        event = {"type": f"{prefix}.{stage}", "item_id": self._id,
                 "output_index": len(self.output), "content_index": 0}
        if prefix == "response.output_text":
            event["logprobs"] = []
        return {**event, **fields}
