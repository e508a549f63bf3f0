"""Anthropic Messages request body -> `ChatRequest` (contract §7 "Request").

Content blocks become the chat template's OpenAI-like shape: `thinking` -> `reasoning_content`,
`tool_use` -> `tool_calls`, `tool_result` -> a `tool` message placed before the user's text.
A final text-only assistant message is a prefill the model continues. `thinking.display`
"omitted" is returned beside the request: only the reply's thinking blocks depend on it.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

from ninfer_engine.client import ServingEngine
from ninfer_engine.config import EngineConfig

from .errors import invalid_value, unsupported
from .forced_tools import ForcedCall, anthropic_format_grammar, auto_grammar, call_grammar
from .media_markers import media_marker
from .openai_fields import sampling_overrides
from .prompt import ChatRequest, map_effort
from .validate import get_bool, get_int, get_list, get_object, get_str, parse_json_object, require

BILLING_HEADER = "x-anthropic-billing-header:"
SIGNATURE_PREFIX = "ninfer-reasoning.v1:"
MAX_CACHE_BREAKPOINTS = 4
_UNSUPPORTED_BLOCKS = ("document", "search_result", "container_upload", "server_tool_use",
                       "web_search_tool_result", "mcp_tool_use", "mcp_tool_result")


def parse_messages_request(
    raw: bytes, engine: ServingEngine, config: EngineConfig, counting: bool = False
) -> tuple[ChatRequest, str, bool]:
    """The parsed request, the `model` label to echo, and whether thinking display is omitted.
    `counting` (count_tokens, whose body has no `max_tokens`): `budget_tokens` is not held
    against an output limit."""
    body = parse_json_object(raw)
    model = require(body, "model")
    if not isinstance(model, str):
        raise invalid_value("model", "'model' must be a string.")
    max_tokens = get_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise invalid_value("max_tokens", "'max_tokens' must be at least 1.")
    if body.get("mcp_servers"):
        raise unsupported("mcp_servers", "MCP servers are not supported.")
    parser = _Conversation()
    parser.system(body.get("system"))
    parser.messages(require(body, "messages"))
    tools = _tools(body.get("tools"), parser)
    kind, forced, parallel = _tool_choice(body.get("tool_choice"))
    if kind == "none":
        tools = None
    strict = _strict_names(body.get("tools"))
    answer, answer_param = anthropic_format_grammar(body)
    if forced is not None:
        if answer is not None:
            raise invalid_value(answer_param, f"'{answer_param}' cannot constrain an answer "
                                "that tool_choice forces to be a tool call.")
        grammar, param = call_grammar(forced, tools, parallel, strict, "tool_choice"), "tool_choice"
    else:  # strict tools' calls match their input_schema; the answer its format, if any
        grammar, param = auto_grammar(tools, parallel, strict, answer=answer), "tools"
        if grammar is None:
            grammar, param = answer, answer_param
    if body.get("cache_control") is not None:
        _check_cache_control(body["cache_control"], "cache_control")
    stop = get_list(body, "stop_sequences") or []
    if not all(isinstance(s, str) for s in stop):
        raise invalid_value("stop_sequences", "'stop_sequences' must be an array of strings.")
    limit = None if counting else max_tokens or engine.default_max_tokens
    kwargs, thinking, budget = _thinking(body, config, limit)
    if parser.prefill and kwargs.get("enable_thinking") is True:
        raise invalid_value("messages", "An assistant prefill needs thinking to be disabled.")
    if parser.prefill:
        kwargs["enable_thinking"] = False  # the prefill continues the answer, not a thought
        thinking = "off"
    request = ChatRequest(
        protocol="anthropic",
        messages=parser.out,
        tools=tools,
        max_tokens=max_tokens,
        sampling=sampling_overrides({k: body.get(k) for k in ("temperature", "top_p", "top_k")},
                                    top_k_max=None),
        stop=tuple(s for s in stop if s),
        template_kwargs=kwargs,
        stream=bool(get_bool(body, "stream")),
        thinking=thinking,
        prefill=parser.prefill,
        thinking_budget=budget,
        grammar=grammar,
        grammar_param=param,
        parallel_tool_calls=parallel,
        breakpoints=tuple(parser.marked),
    )
    return request, model, _display_omitted(body)


def _check_cache_control(value: Any, path: str) -> None:
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise invalid_value(path, f"'{path}' must be {{\"type\": \"ephemeral\"}}.")
    if value.get("ttl", "5m") not in ("5m", "1h"):
        raise invalid_value(f"{path}.ttl", "The cache TTL must be '5m' or '1h'.")


class _Conversation:
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
        _check_cache_control(block["cache_control"], f"{path}.cache_control")
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


def _tool_choice(choice: Any) -> tuple[str, ForcedCall | None, bool]:
    """`tool_choice` -> its type, the call it forces (`any`: to some tool, `tool`: to the named
    one; compiled by forced_tools like Chat's) and whether several calls may come back
    (`disable_parallel_tool_use`)."""
    if choice is None:
        return "auto", None, True
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid_value("tool_choice.type",
                            "tool_choice.type must be 'auto', 'any', 'tool' or 'none'.")
    parallel = get_bool(choice, "disable_parallel_tool_use",
                        "tool_choice.disable_parallel_tool_use") is not True
    if kind == "any":
        return kind, ForcedCall(), parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid_value("tool_choice.name", "tool_choice 'tool' needs a 'name'.")
        return kind, ForcedCall(frozenset({name})), parallel
    return kind, None, parallel


def _tools(tools: Any, parser: _Conversation) -> list[dict[str, Any]] | None:
    """Client tools as OpenAI-shaped function tools for the template."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid_value("tools", "'tools' must be an array.")
    converted = []
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_value(path, f"'{path}' must be an object.")
        if tool.get("type") not in (None, "custom"):
            raise unsupported(f"{path}.type", "Server tools are not supported.")
        get_bool(tool, "strict", f"{path}.strict")
        parser.cache_breakpoint(tool, path, system=True)
        if not isinstance(tool.get("name"), str):
            raise invalid_value(f"{path}.name", "A tool needs a name.")
        function = {"name": tool["name"],
                    "parameters": get_object(tool, "input_schema", f"{path}.input_schema") or {}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted or None


def _strict_names(tools: Any) -> frozenset[str]:
    """The names of the `strict: true` tools (checked by `_tools`)."""
    return frozenset(t["name"] for t in tools or [] if t.get("strict") is True)


def _display_omitted(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    display = thinking.get("display") if isinstance(thinking, dict) else None
    if display not in (None, "summarized", "omitted"):
        raise invalid_value("thinking.display", "thinking.display is 'summarized' or 'omitted'.")
    return display == "omitted"


def _thinking(
    body: dict[str, Any], config: EngineConfig, max_tokens: int | None
) -> tuple[dict[str, Any], str, int | None]:
    """Template kwargs for `thinking` and `output_config.effort`, the log label, and the
    thinking cap (`budget_tokens`, else `--default-thinking-budget`)."""
    kwargs: dict[str, Any] = {}
    budget = config.default_thinking_budget
    if config.no_thinking:
        kwargs["enable_thinking"] = False
    if config.preserve_thinking:
        kwargs["preserve_thinking"] = True
    label = "off" if config.no_thinking else "default"
    thinking = get_object(body, "thinking")
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("disabled", "enabled", "adaptive"):
            raise invalid_value("thinking.type", "thinking.type is disabled, enabled or adaptive.")
        if kind == "enabled":
            requested = get_int(thinking, "budget_tokens", 1024, param="thinking.budget_tokens")
            if requested is None or (max_tokens is not None and requested >= max_tokens):
                raise invalid_value("thinking.budget_tokens",
                                    "budget_tokens must be >= 1024 and less than max_tokens.")
            budget = requested
        kwargs["enable_thinking"] = kind != "disabled"
        label = "off" if kind == "disabled" else "on"
    effort = get_str(get_object(body, "output_config") or {}, "effort", "output_config.effort")
    if effort is not None and kwargs.get("enable_thinking") is not False:
        level = map_effort(effort, "output_config.effort")
        if level == "off":
            kwargs["enable_thinking"] = False
        else:
            kwargs["reasoning_effort"] = level
        label = level
    return kwargs, label, budget
