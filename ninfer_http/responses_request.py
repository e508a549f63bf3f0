"""Responses create body -> `ResponsesRequest` (contract §6 "Create fields", revised).

What real clients send is accepted: unknown top-level keys are ignored (logged once each),
`service_tier`, `client_metadata`, `text.verbosity` and `include` values other than
`reasoning.encrypted_content` and `message.output_text.logprobs` are accepted without effect.
`parallel_tool_calls` is honoured, `prompt_cache_key` is the prefix-reuse session key,
`text.format` json_schema / json_object constrain the answer,
`include: ["message.output_text.logprobs"]` (or `top_logprobs` > 0) returns the answer's
log-probabilities with `top_logprobs` alternatives. Still refused (400
`unsupported_parameter`): `truncation` other than `disabled` and `background: true`. Tools are
parsed by `responses_tools`; the conversation by `responses_items.Conversation`, after the
stored one of `previous_response_id`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.config import EngineConfig

from .errors import ApiError, invalid_value, unsupported
from .forced_tools import format_grammar
from .ignored import log_ignored
from .openai_fields import sampling_overrides, thinking_options
from .prompt import map_effort
from .responses_tools import ResponsesTools, parse_tools
from .validate import get_bool, get_int, get_list, get_object, get_str

KNOWN_KEYS = frozenset({
    "model", "input", "instructions", "previous_response_id", "max_output_tokens", "stream",
    "store", "temperature", "top_p", "metadata", "reasoning", "chat_template_kwargs",
    "preserve_thinking", "tools", "tool_choice", "text", "truncation", "top_logprobs",
    "service_tier", "background", "include", "parallel_tool_calls", "prompt_cache_key",
    "client_metadata", "stream_options", "user", "safety_identifier", "max_tool_calls",
})
ENCRYPTED_REASONING = "reasoning.encrypted_content"
OUTPUT_LOGPROBS = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20
VERBOSITY = ("low", "medium", "high")
MAX_METADATA = 16


@dataclass(frozen=True)
class ResponsesRequest:
    """The validated create fields; `input` is still raw (it needs the stored conversation)."""

    model: str | None
    input: Any
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    stream: bool
    store: bool
    sampling: dict[str, Any]
    template_kwargs: dict[str, Any]
    thinking: str
    preserve_thinking_set: bool  # the request chose preserve_thinking (else the root's applies)
    tools: ResponsesTools  # template function tools after tool_choice, and what they stand for
    grammar: str | None  # the answer's constraint: a forced tool call or text.format
    parallel_tool_calls: bool
    prompt_cache_key: str | None
    encrypted_reasoning: bool  # include has reasoning.encrypted_content
    logprobs: int | None  # alternatives per answer token (0: the chosen only); None: off
    echo: dict[str, Any]  # request config echoed in the Response object


def parse_create(body: dict[str, Any], config: EngineConfig) -> ResponsesRequest:
    """Validate every create field except the items of `input`."""
    log_ignored("Responses field", sorted(set(body) - KNOWN_KEYS))
    if body.get("input") is None:
        raise ApiError(400, "Missing required parameter: 'input'.", "missing_required_parameter",
                       param="input")
    _check_fixed_values(body)
    text = _text(body)
    include = _include(body)
    top_logprobs = get_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    parallel = get_bool(body, "parallel_tool_calls") is not False
    max_output = get_int(body, "max_output_tokens", 0)
    metadata = _metadata(body.get("metadata"))
    reasoning = _reasoning(body)
    nested = get_object(body, "chat_template_kwargs") or {}
    preserve_set = (get_bool(body, "preserve_thinking") is not None
                    or nested.get("preserve_thinking") is not None)
    template_kwargs, thinking = thinking_options(
        {"chat_template_kwargs": nested, "preserve_thinking": body.get("preserve_thinking"),
         "reasoning_effort": reasoning["effort"]}, config)
    fmt = text.get("format") or {"type": "text"}
    tools = parse_tools(body.get("tools"), body.get("tool_choice"), parallel,
                        format_grammar(fmt, "text.format"))
    return ResponsesRequest(
        model=get_str(body, "model"),
        input=body["input"],
        instructions=get_str(body, "instructions"),
        previous_response_id=get_str(body, "previous_response_id"),
        max_output_tokens=max_output,
        stream=bool(get_bool(body, "stream")),
        store=get_bool(body, "store") is not False,
        sampling=sampling_overrides({k: body.get(k) for k in ("temperature", "top_p")}),
        template_kwargs=template_kwargs,
        thinking=thinking,
        preserve_thinking_set=preserve_set,
        tools=tools,
        grammar=tools.grammar,
        parallel_tool_calls=parallel,
        prompt_cache_key=get_str(body, "prompt_cache_key"),
        encrypted_reasoning=ENCRYPTED_REASONING in include,
        logprobs=(top_logprobs or 0) if OUTPUT_LOGPROBS in include or top_logprobs else None,
        echo={"instructions": body.get("instructions"), "max_output_tokens": max_output,
              "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
              "metadata": metadata, "previous_response_id": body.get("previous_response_id"),
              "reasoning": reasoning, "text": {**text, "format": fmt},
              "truncation": "disabled", "parallel_tool_calls": parallel,
              "prompt_cache_key": body.get("prompt_cache_key"),
              "top_logprobs": top_logprobs or 0,
              "service_tier": body.get("service_tier") or "default"},
    )


def _text(body: dict[str, Any]) -> dict[str, Any]:
    """`text`: `format` (checked by forced_tools.format_grammar) and `verbosity` (accepted)."""
    text = get_object(body, "text") or {}
    get_object(text, "format", "text.format")
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITY:
        raise invalid_value("text.verbosity", "'text.verbosity' must be low, medium or high.")
    log_ignored("Responses field", [f"text.{k}" for k in text if k not in ("format", "verbosity")])
    return dict(text)


def _include(body: dict[str, Any]) -> list[str]:
    include = get_list(body, "include") or []
    if not all(isinstance(v, str) for v in include):
        raise invalid_value("include", "'include' must be an array of strings.")
    log_ignored("include value", [v for v in include
                                  if v not in (ENCRYPTED_REASONING, OUTPUT_LOGPROBS)])
    return include


def _check_fixed_values(body: dict[str, Any]) -> None:
    if body.get("truncation") not in (None, "disabled"):
        raise unsupported("truncation", "Only truncation 'disabled' is supported.")
    get_str(body, "service_tier")  # any tier is served the same way
    client_metadata = get_object(body, "client_metadata") or {}
    if not all(isinstance(v, str) for v in client_metadata.values()):
        raise invalid_value("client_metadata", "'client_metadata' values must be strings.")
    get_str(body, "prompt_cache_key")
    get_bool(body, "parallel_tool_calls")
    if get_bool(body, "background"):
        raise ApiError(400, "Background responses are not supported.", "background_not_supported",
                       param="background")


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid_value("metadata", "'metadata' must be an object of string values.")
    if len(value) > MAX_METADATA:
        raise invalid_value("metadata", f"'metadata' holds at most {MAX_METADATA} pairs.")
    return value


def _reasoning(body: dict[str, Any]) -> dict[str, Any]:
    reasoning = get_object(body, "reasoning") or {}
    log_ignored("Responses field", [f"reasoning.{k}" for k in reasoning
                                    if k not in ("effort", "summary")])
    effort = get_str(reasoning, "effort", "reasoning.effort")
    if effort is not None:
        map_effort(effort, "reasoning.effort")
    return {"effort": effort, "summary": get_str(reasoning, "summary", "reasoning.summary")}


def check_model(model: str | None, served: str, required: bool) -> None:
    """`model` must be the public id (required on create, optional on input_tokens)."""
    if model is None and required:
        raise ApiError(400, "Missing required parameter: 'model'.", "missing_required_parameter",
                       param="model")
    if model is not None and model != served:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves '{served}'.",
                       "model_not_found", param="model")
