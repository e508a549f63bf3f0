"""Anthropic Messages `system` and `messages` content blocks -> template messages.

Content blocks become the chat template's OpenAI-like shape: `thinking` -> `reasoning_content`,
`tool_use` -> `tool_calls`, `tool_result` -> a `tool` message placed before the user's text.
A final text-only assistant message is a prefill the model continues. `cache_control` marks
become `ChatRequest.breakpoints`.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

from .errors import invalid_value, unsupported
from .media_markers import media_marker
from .validate import get_bool, get_object, get_str

BILLING_HEADER = "x-anthropic-billing-header:"
SIGNATURE_PREFIX = "ninfer-reasoning.v1:"
MAX_CACHE_BREAKPOINTS = 4
_UNSUPPORTED_BLOCKS = ("document", "search_result", "container_upload", "server_tool_use",
                       "web_search_tool_result", "mcp_tool_use", "mcp_tool_result")


def check_cache_control(value: Any, path: str) -> None:
    """A `cache_control` mark must be `{"type": "ephemeral"}`, its TTL "5m" or "1h"."""
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise invalid_value(path, f"'{path}' must be {{\"type\": \"ephemeral\"}}.")
    if value.get("ttl", "5m") not in ("5m", "1h"):
        raise invalid_value(f"{path}.ttl", "The cache TTL must be '5m' or '1h'.")


class Conversation:
    """Accumulates template messages from `system` and `messages`."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.prefill = ""
        self.breakpoints = 0
        self.marked: list[int] = []  # `ChatRequest.breakpoints`

    def cache_breakpoint(self, block: dict[str, Any], path: str, system: bool = False) -> None:
        """A block's `cache_control`: the end of the message being parsed (`system`: of the
        leading system messages) is a reusable prefix."""
        if block.get("cache_control") is None:
            return
        check_cache_control(block["cache_control"], f"{path}.cache_control")
        self.breakpoints += 1
        if self.breakpoints > MAX_CACHE_BREAKPOINTS:
            raise invalid_value(f"{path}.cache_control",
                                f"At most {MAX_CACHE_BREAKPOINTS} cache breakpoints are allowed.")
        self.marked.append(-1 if system else len(self.out))

    def system(self, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, str):
            texts = [value]
        elif isinstance(value, list):
            texts = [self._text_block(b, f"system[{i}]") for i, b in enumerate(value)]
            # Claude Code's per-request billing line would defeat prefix reuse.
            if texts and texts[0].startswith(BILLING_HEADER):
                texts = texts[1:]
        else:
            raise invalid_value("system", "'system' must be a string or an array of text blocks.")
        if any(texts):
            self.out.append({"role": "system", "content": "\n".join(texts)})

    def _text_block(self, block: Any, path: str) -> str:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid_value(path, f"'{path}' must be a text block.")
        self.cache_breakpoint(block, path)
        text = block.get("text")
        if not isinstance(text, str):
            raise invalid_value(f"{path}.text", f"'{path}.text' must be a string.")
        return text

    def messages(self, value: Any) -> None:
        if not isinstance(value, list) or not value:
            raise invalid_value("messages", "'messages' must be a non-empty array.")
        for i, message in enumerate(value):
            path = f"messages[{i}]"
            if not isinstance(message, dict):
                raise invalid_value(path, f"'{path}' must be an object.")
            role = message.get("role")
            if role not in ("user", "assistant", "system"):
                raise invalid_value(f"{path}.role", "Roles are 'user', 'assistant' or 'system'.")
            content = message.get("content")
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            if not isinstance(content, list):
                raise invalid_value(f"{path}.content", "Content must be a string or blocks.")
            last = i == len(value) - 1
            self._message(role, content, f"{path}.content", last)

    def _message(self, role: str, blocks: list[Any], path: str, last: bool) -> None:
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(blocks):
            where = f"{path}[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(self._text_block(block, where))
            elif kind == "image" and role == "user":
                self.cache_breakpoint(block, where)
                texts.append(_image_marker(block, where))
            elif kind == "thinking" and role == "assistant":
                reasoning.append(_thinking_text(block, where))
            elif kind == "redacted_thinking":
                continue
            elif kind == "tool_use" and role == "assistant":
                calls.append(_tool_call(block, where))
            elif kind == "tool_result" and role == "user":
                self.cache_breakpoint(block, where)
                self.out.append(_tool_result(block, where))
            elif kind in _UNSUPPORTED_BLOCKS:
                raise unsupported(where, f"'{kind}' content blocks are not supported.")
            else:
                raise invalid_value(f"{where}.type", f"Unexpected content block {kind!r}.")
        if role == "assistant" and last and not calls and not reasoning:
            self.prefill = "".join(texts)
            return
        if not texts and not calls and not reasoning:
            return  # a user turn of tool results only
        message: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
        if reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        self.out.append(message)


def _image_marker(block: dict[str, Any], path: str) -> str:
    """An image block's marker (`media_markers`): a `base64` source as a data: URL, or a
    `url` source."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise invalid_value(f"{path}.source", "A base64 image source needs string "
                                "'media_type' and 'data'.")
        return media_marker("image", f"data:{media_type};base64,{data}", path)
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise invalid_value(f"{path}.source.url", "An image URL must be http(s)://.")
        return media_marker("image", url, path)
    raise invalid_value(f"{path}.source.type", "Image sources are 'base64' or 'url'.")


def _thinking_text(block: dict[str, Any], path: str) -> str:
    """History thinking; an omitted-display block carries its text in the signature."""
    text = block.get("thinking") or ""
    signature = block.get("signature") or ""
    if not isinstance(text, str) or not isinstance(signature, str):
        raise invalid_value(path, "Thinking blocks hold string 'thinking' and 'signature'.")
    if not text and signature.startswith(SIGNATURE_PREFIX):
        try:
            return base64.b64decode(signature[len(SIGNATURE_PREFIX):], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise invalid_value(f"{path}.signature", "Malformed thinking signature.") from None
    return text


def _tool_call(block: dict[str, Any], path: str) -> dict[str, Any]:
    name, call_id = block.get("name"), block.get("id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise invalid_value(path, "A tool_use block needs string 'id' and 'name'.")
    arguments = get_object(block, "input", f"{path}.input") or {}
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict[str, Any], path: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise invalid_value(f"{path}.tool_use_id", "A tool_result needs 'tool_use_id'.")
    get_bool(block, "is_error", f"{path}.is_error")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise unsupported(f"{path}.content[{k}]", "Tool results may only hold text.")
            parts.append(get_str(part, "text", f"{path}.content[{k}].text") or "")
        content = "\n".join(parts)
    if not isinstance(content, str):
        raise invalid_value(f"{path}.content", "Tool result content must be text.")
    return {"role": "tool", "tool_call_id": call_id, "content": content}
