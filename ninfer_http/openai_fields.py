"""Chat Completions body fields -> `ChatRequest` (contract §5 Accepted / Rejected / Ignored).

Every rejected field is a 400 whose `param` names it. Neutral values of rejected features
(`logprobs: false`, empty `logit_bias`, `store: false`, `n: 1`...) and unknown keys are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.client import ServingEngine
from ninfer_engine.config import EngineConfig

from .errors import ApiError, invalid_value, unsupported
from .forced_tools import format_grammar
from .openai_messages import normalize_messages, normalize_tools
from .prompt import ChatRequest, map_effort
from .validate import (
    INT64_MAX,
    INT64_MIN,
    get_bool,
    get_int,
    get_list,
    get_number,
    get_object,
    is_number,
    parse_json_object,
    require,
)

# Float sampler fields a request may override, with their allowed ranges.
_SAMPLING_NUMBERS = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
_CONSTRAINED = ("grammar", "structured_outputs")
MAX_STOP_STRINGS = 4
MAX_CHOICES = 8
MAX_TOP_K = 20  # the manual page's top-k range for OpenAI paths
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class StreamOptions:
    """What a Chat stream carries beside its deltas (all off for a non-stream request)."""

    include_usage: bool = False  # a final usage chunk
    timings_per_token: bool = False  # running `timings` on every reasoning/content chunk
    return_progress: bool = False  # `prompt_progress` chunks during prefill
    n: int = 1  # choices


def parse_chat_request(
    raw: bytes, engine: ServingEngine, config: EngineConfig
) -> tuple[ChatRequest, StreamOptions]:
    """The parsed request and the extras its stream carries."""
    body = parse_json_object(raw)
    model = require(body, "model")
    if not isinstance(model, str):
        raise invalid_value("model", "'model' must be a string.")
    if model != engine.model_id:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves "
                       f"'{engine.model_id}'.", "model_not_found", param="model")
    messages = normalize_messages(body.get("messages"))
    reject_unsupported(body)
    tools = normalize_tools(body.get("tools"), body.get("tool_choice"),
                            body.get("parallel_tool_calls"), _response_format(body))
    max_tokens = get_int(body, "max_completion_tokens", 0)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", 0)
    stream = bool(get_bool(body, "stream"))
    n = get_int(body, "n", 1, MAX_CHOICES) or 1
    stream_options = get_object(body, "stream_options") or {}
    options = StreamOptions(
        bool(get_bool(stream_options, "include_usage", "stream_options.include_usage")),
        bool(get_bool(body, "timings_per_token")),
        bool(get_bool(body, "return_progress")),
        n,
    )
    template_kwargs, thinking = thinking_options(body, config)
    request = ChatRequest(
        protocol="openai-chat",
        messages=messages,
        tools=tools.template,
        max_tokens=max_tokens,
        sampling=sampling_overrides(body),
        stop=stop_strings(body.get("stop")),
        template_kwargs=template_kwargs,
        stream=stream,
        thinking=thinking,
        thinking_budget=config.default_thinking_budget,
        report_progress=stream and options.return_progress,
        grammar=tools.grammar,
        grammar_param=tools.param,
        logprobs=_logprobs(body),
        prompt_logprobs=_prompt_logprobs(body, stream),
        ignore_eos=bool(get_bool(body, "ignore_eos")),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
    )
    return request, options if stream else StreamOptions(n=n)


def _response_format(body: dict[str, Any]) -> str | None:
    """The grammar of `response_format` (None for text or when absent)."""
    response_format = get_object(body, "response_format")
    if response_format is None:
        return None
    return format_grammar(response_format, "response_format")


def _logprobs(body: dict[str, Any]) -> int | None:
    """Alternatives per token when `logprobs` is true (None: not asked for)."""
    top = get_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if not get_bool(body, "logprobs"):
        if top:
            raise invalid_value("top_logprobs", "'top_logprobs' needs 'logprobs': true.")
        return None
    return top or 0


def _prompt_logprobs(body: dict[str, Any], stream: bool) -> int | None:
    """vLLM's `prompt_logprobs` (alternatives per prompt token), which it refuses streamed."""
    top = get_int(body, "prompt_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and stream:
        raise unsupported("prompt_logprobs", "'prompt_logprobs' is not available with "
                          "'stream': true (as in vLLM); send it without streaming.")
    return top


def sampling_overrides(body: dict[str, Any], top_k_max: int | None = MAX_TOP_K
                       ) -> dict[str, Any]:
    """The sampler fields this request sets, by `SamplingParams` name (`top_k_max` None: no
    upper bound, as Anthropic's API has none)."""
    overrides: dict[str, Any] = {}
    for key, (low, high) in _SAMPLING_NUMBERS.items():
        value = get_number(body, key, low, high)
        if value is not None:
            overrides[key] = value
    top_k = get_int(body, "top_k", 0, top_k_max)
    if top_k is not None:
        overrides["top_k"] = top_k
    seed = get_int(body, "seed", INT64_MIN, INT64_MAX)
    if seed is not None:
        overrides["seed"] = seed
    return overrides


def stop_strings(value: Any) -> tuple[str, ...]:
    """`stop`: a string or up to four strings; empty strings are dropped."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid_value("stop", "'stop' must be a string or an array of strings.")
    if len(value) > MAX_STOP_STRINGS:
        raise invalid_value("stop", f"'stop' holds at most {MAX_STOP_STRINGS} strings.")
    return tuple(s for s in value if s)


def thinking_options(body: dict[str, Any], config: EngineConfig) -> tuple[dict[str, Any], str]:
    """Template kwargs for thinking (request > process flags > template) and a log label."""
    nested = get_object(body, "chat_template_kwargs") or {}
    kwargs = dict(nested)
    defaults = {"enable_thinking": False if config.no_thinking else None,
                "preserve_thinking": True if config.preserve_thinking else None}
    explicit: dict[str, bool] = {}
    for key, default in defaults.items():
        top = get_bool(body, key)
        inner = get_bool(nested, key, f"chat_template_kwargs.{key}")
        if top is not None and inner is not None and top != inner:
            raise invalid_value(key, f"'{key}' and 'chat_template_kwargs.{key}' disagree.")
        value = top if top is not None else inner
        if value is not None:
            explicit[key] = value
        value = default if value is None else value
        if value is None:
            kwargs.pop(key, None)
        else:
            kwargs[key] = value
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise invalid_value("reasoning_effort", "'reasoning_effort' must be a string.")
    level = map_effort(effort, "reasoning_effort") if effort is not None else None
    if level == "off":
        if explicit.get("enable_thinking") is True:
            raise invalid_value("reasoning_effort",
                                "reasoning_effort 'none' contradicts enable_thinking=true.")
        kwargs["enable_thinking"] = False
    elif level is not None:
        kwargs["reasoning_effort"] = level
    if kwargs.get("enable_thinking") is False:
        return kwargs, "off"
    return kwargs, level or ("on" if kwargs.get("enable_thinking") else "default")


def reject_unsupported(body: dict[str, Any]) -> None:
    """400 for every feature this server cannot honour; neutral values pass."""
    for key, value in body.items():
        if value is not None and (key in _CONSTRAINED or key.startswith("guided_")):
            raise unsupported(key, f"Constrained output ('{key}') is not supported.")
    bias = get_object(body, "logit_bias") or {}
    if not all(is_number(v) for v in bias.values()):
        raise invalid_value("logit_bias", "'logit_bias' values must be numbers.")
    if any(v != 0 for v in bias.values()):
        raise unsupported("logit_bias", "A non-zero logit_bias is not supported.")
    modalities = get_list(body, "modalities") or []
    if "audio" in modalities:
        raise unsupported("modalities", "Audio output is not supported.")
    if any(m != "text" for m in modalities):
        raise invalid_value("modalities", "'modalities' may only contain 'text'.")
    if body.get("audio") is not None:
        raise unsupported("audio", "Audio output is not supported.")
    if get_bool(body, "store"):
        raise unsupported("store", "store=true is not supported on Chat Completions.")
    repetition = get_number(body, "repetition_penalty")
    if repetition is not None and repetition != 1.0:
        raise unsupported("repetition_penalty", "repetition_penalty is not supported.")
