"""Legacy Completions body -> a prepared engine request (`POST /v1/completions`).

The prompt is used as given, without a chat template: a string (tokenized as the engine's
tokenizer does, BOS included when the model asks for it) or token ids. One prompt per request;
`n` up to 8 (not streamed). `echo` prepends the prompt's text. `logprobs` N (0..20) returns the
chosen token's log-probability and the N most likely ones per output token, and with `echo`
the prompt tokens' too (the first one null; lm-eval-harness' loglikelihood sends `echo`,
`logprobs` and `max_tokens: 0`). vLLM's `prompt_logprobs` N (0..20) returns them in its own
form, per choice. Either computes the whole prompt (no prefix reuse). vLLM's `ignore_eos` is
honoured. Other keys are ignored, like Chat's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.client import ServingEngine
from ninfer_engine.types import GenerationRequest

from .errors import ApiError, invalid_value, unsupported
from .openai_fields import MAX_CHOICES, MAX_TOP_LOGPROBS, sampling_overrides, stop_strings
from .prompt import PreparedRequest, check_context, resolve_sampling
from .validate import get_bool, get_int, get_object, is_int, is_number, parse_json_object, require

PROTOCOL = "openai-completions"
DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for this endpoint


@dataclass(frozen=True)
class CompletionRequest:
    prepared: PreparedRequest
    prompt_text: str  # what `echo` prepends
    echo: bool
    stream: bool
    include_usage: bool
    n: int
    echo_logprobs: bool  # the prompt's entries lead the `logprobs` object (`echo` + `logprobs`)
    prompt_logprobs: int | None  # vLLM's per-choice `prompt_logprobs`, with N alternatives


def _prompt_ids(engine: ServingEngine, prompt: Any) -> tuple[list[int], str]:
    """(token ids, text) of the one prompt: a string, token ids, or a list of one of them."""
    if isinstance(prompt, list) and prompt and not all(is_int(t) for t in prompt):
        if len(prompt) != 1:
            raise unsupported("prompt", "One prompt per request is supported.")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid_value("prompt", "'prompt' must not be empty.")
        return engine.tokenizer.encode(prompt), prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        vocab = engine.tokenizer.vocab_size
        if not all(0 <= t < vocab for t in prompt):  # before decoding them: the tokenizer throws
            raise invalid_value("prompt", f"Token ids must be in 0..{vocab - 1}, this model's "
                                "vocabulary.")
        return list(prompt), engine.tokenizer.decode(prompt)
    raise invalid_value("prompt", "'prompt' must be a string or an array of token ids.")


def _logprobs(body: dict[str, Any]) -> int | None:
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    return get_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)


def parse_completion(raw: bytes, engine: ServingEngine, request_id: str) -> CompletionRequest:
    body = parse_json_object(raw)
    model = require(body, "model")
    if model != engine.model_id:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves "
                       f"'{engine.model_id}'.", "model_not_found", param="model")
    ids, text = _prompt_ids(engine, require(body, "prompt"))
    if body.get("suffix"):
        raise unsupported("suffix", "'suffix' (insertion) is not supported.")
    n = get_int(body, "n", 1, MAX_CHOICES) or 1
    best_of = get_int(body, "best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise unsupported("best_of", "best_of must equal n.")
    stream = bool(get_bool(body, "stream"))
    if stream and n > 1:
        raise unsupported("n", "n > 1 is served without streaming only.")
    echo = bool(get_bool(body, "echo"))
    logprobs = _logprobs(body)
    vllm_prompt = get_int(body, "prompt_logprobs", 0, MAX_TOP_LOGPROBS)
    echo_logprobs = echo and logprobs is not None
    scored = [k for k in (logprobs if echo_logprobs else None, vllm_prompt) if k is not None]
    bias = get_object(body, "logit_bias") or {}
    if any(not is_number(v) or v != 0 for v in bias.values()):
        raise unsupported("logit_bias", "A non-zero logit_bias is not supported.")
    try:
        check_context(len(ids), engine.max_context)
    except ApiError as exc:
        exc.param = "prompt"  # the shared check names Chat's field
        raise
    wanted = get_int(body, "max_tokens", 0)
    max_tokens = min(DEFAULT_MAX_TOKENS if wanted is None else wanted,
                     engine.max_context - len(ids))
    generation = GenerationRequest(
        request_id=request_id, prompt_ids=tuple(ids),
        sampling=resolve_sampling(engine.sampling_defaults, sampling_overrides(body)),
        max_tokens=max_tokens, stop=stop_strings(body.get("stop")), protocol=PROTOCOL,
        ignore_eos=bool(get_bool(body, "ignore_eos")), logprobs=logprobs,
        logprob_sink=None if logprobs is None else [],
        prompt_logprobs=max(scored) if scored else None,
        prompt_logprob_sink=[] if scored else None)
    options = get_object(body, "stream_options") or {}
    include_usage = bool(get_bool(options, "include_usage", "stream_options.include_usage"))
    return CompletionRequest(PreparedRequest(generation, len(ids), max_tokens), text, echo,
                             stream, include_usage, n, echo_logprobs, vllm_prompt)
