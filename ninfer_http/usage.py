"""Usage and timing objects built from the engine's `Usage` and `Timings` (contract §5, §8)."""
from __future__ import annotations

from typing import Any

from ninfer_engine.types import Timings, Usage


def openai_chat_usage(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    """Chat Completions `usage`; `completion_tokens` includes reasoning tokens."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens": usage.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def responses_usage(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    """Responses `usage`; `output_tokens` includes the reasoning tokens."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def anthropic_usage(usage: Usage, thinking_tokens: int = 0) -> dict[str, Any]:
    """Messages `usage`: `input_tokens` is the uncached part of the prompt."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation": None,
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"thinking_tokens": thinking_tokens},
        "server_tool_use": None,
        "service_tier": None,
    }


def _ratio(numerator: float, denominator: float) -> float:
    # Rates are always finite: an empty phase reports 0 instead of inf or NaN.
    return numerator / denominator if denominator > 0 else 0.0


def decode_rate(timings: Timings) -> float:
    """Decode tokens per second over the n - 1 intervals between the n output tokens."""
    return _ratio(max(timings.predicted_n - 1, 0), timings.decode_s)


def llama_timings(timings: Timings) -> dict[str, Any]:
    """llama.cpp-style `timings`, with draft counters when speculation ran."""
    prompt_ms = timings.prefill_s * 1000.0
    predicted_ms = timings.decode_s * 1000.0
    intervals = max(timings.predicted_n - 1, 0)
    result: dict[str, Any] = {
        "cache_n": timings.cache_n,
        "prompt_n": timings.prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": _ratio(prompt_ms, timings.prompt_n),
        "prompt_per_second": _ratio(timings.prompt_n, timings.prefill_s),
        "predicted_n": timings.predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": _ratio(predicted_ms, intervals),
        "predicted_per_second": decode_rate(timings),
    }
    if timings.draft_n:
        result["draft_n"] = timings.draft_n
        result["draft_n_accepted"] = timings.draft_accepted
    return result
