"""Protocol-neutral request preparation: template, tokens, context check, sampler, limits.

Every protocol module parses its own body into one `ChatRequest` whose messages already have
the chat template's OpenAI-like shape (`role`, `content` text, optional `reasoning_content`,
`tool_calls`, `tool_call_id`); `prepare()` turns it into the engine's `GenerationRequest`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ninfer_engine.client import ServingEngine
from ninfer_engine.constrained import ConstraintUnavailable, GrammarError, compile_constraint
from ninfer_engine.constrained.matcher import llg_tokenizer
from ninfer_engine.types import GenerationRequest, SamplingParams
from ninfer_engine.vision.preprocess import MediaError
from ninfer_engine.vision.tower import MediaBudgetExceeded

from .anchors import prompt_anchors
from .errors import ApiError, invalid_value

SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))

# Request effort names -> the level the chat template receives (contract §5 `reasoning_effort`).
EFFORT_LEVELS = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "xhigh",
    "max": "xhigh",
    "adaptive": "xhigh",
    "xhigh": "xhigh",
}

# Forced when the thinking cap is reached (contract §8): Qwen's closing guidance and `</think>`.
THINKING_CLOSE = ("\n\nConsidering the limited time by the user, I have to give the solution "
                  "based on the thinking directly now.\n</think>\n\n")
THINK_END = "</think>"


@dataclass(frozen=True)
class ChatRequest:
    """One parsed generation request, whatever protocol it came in."""

    protocol: str  # "openai-chat" | "openai-responses" | "anthropic"
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None  # None = the engine's default
    sampling: dict[str, Any] = field(default_factory=dict)  # request overrides by field name
    stop: tuple[str, ...] = ()
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    thinking: str = "default"  # log label: "default", "on", "off" or an effort level
    prefill: str = ""  # the start of the answer, continued by the model (Anthropic prefill)
    thinking_budget: int | None = None  # the reasoning cap, applied when the prompt opens thinking
    report_progress: bool = False  # Chat's `return_progress` on a stream
    grammar: str | None = None  # llguidance grammar the answer must follow (forced_tools.py)
    grammar_param: str = "response_format"  # the field that asked for it (error messages)
    logprobs: int | None = None  # alternatives per output token (0: chosen only); None: off
    prompt_logprobs: int | None = None  # vLLM's: alternatives per prompt token; None: off
    ignore_eos: bool = False  # vLLM's: the end tokens do not end the answer (benchmarks)
    parallel_tool_calls: bool = True  # False: at most one tool call is returned
    session_key: str | None = None  # prefix-reuse hint (Responses' prompt_cache_key)
    # messages whose end is a reusable prefix (Anthropic cache_control); -1: the leading system
    # messages (a breakpoint on a tool or a system block)
    breakpoints: tuple[int, ...] = ()


@dataclass(frozen=True)
class PreparedRequest:
    generation: GenerationRequest
    prompt_tokens: int
    max_tokens: int  # effective output limit after the context clamp
    opens_thinking: bool = False  # the prompt ends inside `<think>`: output starts as reasoning
    tools: list[dict[str, Any]] | None = None  # offered tools, whose schemas type call arguments
    parallel_tool_calls: bool = True
    grammar: str | None = None  # compiled afresh for every choice (`choice`)


def resolve_sampling(defaults: SamplingParams, overrides: dict[str, Any]) -> SamplingParams:
    """Request fields win over the engine defaults (preset, then process flags)."""
    unknown = set(overrides) - SAMPLING_FIELDS
    if unknown:
        raise ValueError(f"not sampler fields: {sorted(unknown)}")
    return dataclasses.replace(defaults, **overrides)


def map_effort(effort: str, param: str) -> str:
    """A request effort name -> the template's level; `none` -> `off`."""
    if effort == "none":
        return "off"
    if effort not in EFFORT_LEVELS:
        names = ", ".join(["none", *EFFORT_LEVELS])
        raise invalid_value(param, f"'{param}' must be one of {names}; got {effort!r}.")
    return EFFORT_LEVELS[effort]


def expand_media(engine: ServingEngine, text_ids: list[int], items: list) -> tuple[list[int], Any]:
    """The prompt text's token ids with each media placeholder expanded to its item's tokens
    (`MediaPlanner.prepare`), and the `MediaPrompt` (None without media)."""
    if not items:
        return text_ids, None
    try:
        ids, media = engine.media_planner.prepare(text_ids, items,
                                           lambda text: list(encode_fragment(engine, text)))
    except MediaBudgetExceeded as exc:
        raise ApiError(400, f"{exc}.", "media_budget_exceeded", param="messages") from None
    except MediaError as exc:
        raise ApiError(400, f"The media do not fit the prompt: {exc}.", "invalid_media",
                       param="messages") from None
    return list(ids), media


def render_text(engine: ServingEngine, request: ChatRequest) -> str:
    """The prompt text: the rendered conversation plus any answer prefill."""
    try:
        text = engine.chat_template.render(
            request.messages, tools=request.tools, add_generation_prompt=True,
            **request.template_kwargs,
        )
    except Exception as exc:  # template errors (raise_exception, bad roles) are the client's
        raise ApiError(400, f"The chat template rejected the messages: {exc}", "invalid_prompt",
                       param="messages") from None
    return text + request.prefill


def opens_thinking(prompt: str) -> bool:
    """Whether the prompt ends inside an open think block (Qwen puts `<think>\\n` there)."""
    return prompt.rstrip().endswith("<think>")


def check_context(prompt_tokens: int, max_context: int) -> None:
    """Prompt + 1 output token must fit the context (contract §4 "Context")."""
    if prompt_tokens + 1 > max_context:
        raise ApiError(
            400,
            f"The prompt has {prompt_tokens} tokens; the context holds {max_context} "
            "including at least one output token.",
            "context_length_exceeded",
            param="messages",
            extra={"prompt_tokens": prompt_tokens, "max_context": max_context},
        )


def encode_fragment(engine: ServingEngine, text: str) -> tuple[int, ...]:
    """Token ids of text inserted mid-output: without the BOS a whole-prompt encoding adds."""
    lead = engine.tokenizer.encode("")
    return tuple(engine.tokenizer.encode(text)[len(lead):])


def thinking_cap(engine: ServingEngine, budget: int, max_tokens: int,
                 constrained: bool = False) -> dict[str, Any]:
    """The engine's cap fields; 400 when the budget, the close and one answer token cannot fit
    the effective output limit. A `constrained` answer's grammar applies right after
    `</think>`: its close stops there (the blank line after it is not the grammar's)."""
    close = THINKING_CLOSE
    if constrained:
        close = close[: close.rindex(THINK_END) + len(THINK_END)]
    close_ids = encode_fragment(engine, close)
    if budget + len(close_ids) + 1 > max_tokens:
        raise ApiError(
            400,
            f"A thinking budget of {budget} tokens plus the {len(close_ids)}-token close and one "
            f"answer token does not fit the output limit of {max_tokens} tokens.",
            "thinking_budget_capacity_insufficient",
        )
    return {"thinking_budget": budget, "thinking_close_ids": close_ids,
            "think_end_ids": encode_fragment(engine, THINK_END)}


def constrainable(engine: ServingEngine) -> bool:
    """Whether the engine's tokenizer can drive constrained decoding."""
    try:
        llg_tokenizer(engine.tokenizer)
    except ConstraintUnavailable:
        return False
    return True


def _constraint(engine: ServingEngine, grammar: str | None, thinks: bool,
                param: str | None = None) -> Any:
    """A fresh grammar state for one generation; a thinking model is constrained after
    `</think>` only."""
    if grammar is None:
        return None
    start_after = encode_fragment(engine, THINK_END) if thinks else ()
    try:
        return compile_constraint(engine.tokenizer, grammar, start_after)
    except ConstraintUnavailable as exc:
        raise ApiError(400, f"Constrained output is not available: {exc}.",
                       "unsupported_parameter", param=param) from None
    except GrammarError as exc:
        raise ApiError(400, f"The output constraint cannot be enforced: {exc}",
                       "invalid_value", param=param) from None


def choice(engine: ServingEngine, prepared: PreparedRequest, index: int) -> PreparedRequest:
    """The request of choice `index` (n > 1): its own id, grammar state and log-probability
    sink, and seed + index when a seed was given (choices must differ)."""
    generation = prepared.generation
    seed = generation.sampling.seed
    sampling = generation.sampling if seed is None else dataclasses.replace(
        generation.sampling, seed=seed + index)
    forked = dataclasses.replace(
        generation, request_id=f"{generation.request_id}-{index}", sampling=sampling,
        constraint=_constraint(engine, prepared.grammar, prepared.opens_thinking),
        logprob_sink=None if generation.logprobs is None else [],
        prompt_logprob_sink=None if generation.prompt_logprobs is None else [])
    return dataclasses.replace(prepared, generation=forked)


def prepare(engine: ServingEngine, request: ChatRequest, request_id: str,
            rendered: tuple[str, list, list[int]] | None = None) -> PreparedRequest:
    """Build the engine request; raises `ApiError` for anything the client must fix.
    `rendered`: the prompt text with media placeholders, its loaded media items and the text's
    token ids (`media.prepare_with_media`, the protocols' path); default: the conversation
    rendered and encoded here, without media."""
    if rendered is None:
        text = render_text(engine, request)
        rendered = (text, [], engine.tokenizer.encode(text))
    text, items, text_ids = rendered
    prompt_ids, media = expand_media(engine, text_ids, items)
    check_context(len(prompt_ids), engine.max_context)
    wanted = engine.default_max_tokens if request.max_tokens is None else request.max_tokens
    max_tokens = min(wanted, engine.max_context - len(prompt_ids))
    thinks = opens_thinking(text)
    grammar = request.grammar
    if grammar is not None and request.grammar_param == "tools" and not constrainable(engine):
        # Constrained tools under `auto` only tighten what the model may call; an engine whose
        # tokenizer cannot drive llguidance (a scripted test engine) serves them unconstrained,
        # as before they were enforced. Forced calls and response formats stay a 400 there.
        grammar = None
    cap: dict[str, Any] = {}
    if thinks and request.thinking_budget is not None:
        cap = thinking_cap(engine, request.thinking_budget, max_tokens, grammar is not None)
    generation = GenerationRequest(
        request_id=request_id,
        prompt_ids=tuple(prompt_ids),
        sampling=resolve_sampling(
            engine.thinking_sampling_defaults if thinks else engine.sampling_defaults,
            request.sampling),
        max_tokens=max_tokens,
        stop=request.stop,
        protocol=request.protocol,
        report_progress=request.report_progress,
        session_key=request.session_key,
        anchors=prompt_anchors(engine, request, prompt_ids),
        constraint=_constraint(engine, grammar, thinks, request.grammar_param),
        logprobs=request.logprobs,
        logprob_sink=None if request.logprobs is None else [],
        prompt_logprobs=request.prompt_logprobs,
        prompt_logprob_sink=None if request.prompt_logprobs is None else [],
        ignore_eos=request.ignore_eos,
        media=media,
        **cap,
    )
    return PreparedRequest(generation, len(prompt_ids), max_tokens, thinks, request.tools,
                           request.parallel_tool_calls, grammar)
