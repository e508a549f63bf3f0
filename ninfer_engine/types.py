"""The messages that cross the engine boundary: requests in, token events out.

`ninfer_http` builds one `GenerationRequest` per protocol request and reads `TokenEvent`s back;
observers read `EngineStats` (see stats.py). Nothing else of the engine is public.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class EngineState(str, Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    RELOADING = "reloading"
    STOPPED = "stopped"


@dataclass(frozen=True)
class SamplingParams:
    """Resolved sampler settings (preset -> process flags -> request fields already applied)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None = random per request

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether presence or frequency penalties change the logits."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, protocol-neutral. `prompt_ids` is the fully rendered, tokenized prompt."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256  # already clamped to max_context - prompt by the caller; 0 = prefill only
    stop: tuple[str, ...] = ()  # stop strings, matched in the decoded text (withheld from output)
    protocol: str = "openai-chat"
    session_key: str | None = None  # prefix-reuse hint
    # (prompt position, reuse path) where a reusable prefix ends: a message boundary
    # (`--turn-anchors`: "private_turn_closure"), an Anthropic cache_control breakpoint or the
    # instructions before a Responses prompt_cache_key conversation ("shared_stable_prefix");
    # the hybrid family keeps a recurrent-state snapshot there
    anchors: tuple[tuple[int, str], ...] = ()
    ignore_eos: bool = False  # benchmarks: always generate max_tokens
    # Thinking cap (contract §8): set only when the output starts inside reasoning. After
    # `thinking_budget` reasoning tokens the engine forces `thinking_close_ids` (Qwen's closing
    # guidance plus `</think>`); output ending in `think_end_ids` closed the reasoning itself.
    thinking_budget: int | None = None
    thinking_close_ids: tuple[int, ...] = ()
    think_end_ids: tuple[int, ...] = ()
    report_progress: bool = False  # one `progress` event per prefill chunk
    # Constrained decoding: a `constrained.TokenConstraint` (built by the caller, one per
    # generation) masks every sampled token of this request.
    constraint: Any = field(default=None, compare=False)
    # Log-probabilities: `logprobs` alternatives per output token (0 = the chosen token only);
    # the sampler appends one `TokenLogprob` per output token to `logprob_sink` before that
    # token's event is emitted, so a reader that has the event has its entries.
    logprobs: int | None = None
    logprob_sink: list | None = field(default=None, compare=False)
    # Prompt log-probabilities (Completions `echo` + `logprobs`, vLLM's `prompt_logprobs`): one
    # `TokenLogprob` per prompt token (the first has none) with `prompt_logprobs` alternatives,
    # in `prompt_logprob_sink` before the first output event. Such a prompt is computed in full
    # (no prefix reuse: a reused position has no logits).
    prompt_logprobs: int | None = None
    prompt_logprob_sink: list | None = field(default=None, compare=False)
    # Media (`vision.prompt.MediaPrompt`): the prompt's image/video spans, their pixels and the
    # multimodal rotary positions; `prompt_ids` already holds the expanded placeholders.
    media: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability under the logits the sampler was given (before
    penalties, masks and temperature), and the `top` most likely tokens there. A token forced
    by the engine (thinking close) has `logprob` None."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None  # 1 + how many tokens were more likely (prompt tokens only)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Phase timings of one request, in seconds (llama.cpp's `timings` derive from these)."""

    queue_s: float = 0.0
    prefill_s: float = 0.0  # admission -> first token read on the host (its step done)
    decode_s: float = 0.0  # first token -> last token
    prompt_n: int = 0  # prompt tokens actually computed (not reused)
    cache_n: int = 0  # prompt tokens reused from a prefix checkpoint
    # what the reuse restored (http-contract §4's reuse paths): "root" when nothing
    reuse_path: str = "root"
    predicted_n: int = 0
    draft_n: int = 0
    draft_accepted: int = 0
    # final event only: accepted drafts of each verified round, in order; decode steps this
    # request did not draft while speculation was on; with --log-speculation-detail, the share
    # of its output tokens whose n-gram occurs in its prompt (`speculation.prompt_ngram_overlap`)
    draft_rounds: tuple[int, ...] = ()
    draft_fallback: int = 0
    prompt_ngram_overlap: float | None = None
    vision_s: float = 0.0  # the vision tower's time on this request's media (within prefill)


@dataclass(frozen=True)
class EngineError:
    """Why a request failed. `status` is the HTTP status the protocols should use."""

    message: str
    code: str = "internal_error"
    status: int = 500


@dataclass(frozen=True)
class TokenEvent:
    """What `Engine.submit()` yields, in order. The last event has `finish` set."""

    text: str = ""  # newly decoded text, UTF-8 safe, stop strings withheld
    token_ids: tuple[int, ...] = ()
    finish: str | None = None  # "stop" | "length" | "cancelled" | "error"
    stop_sequence: str | None = None  # the stop string that ended generation, if any
    usage: Usage | None = None
    timings: Timings | None = None  # final on the last event; the running ones on text events
    error: EngineError | None = None
    # Prompt tokens (total, reused from cache, processed so far incl. cache) after a prefill
    # chunk; only when the request asked for `report_progress`.
    progress: tuple[int, int, int] | None = None
