"""The interface `ninfer_http` serves through. `Engine` implements it; tests may script it.

Everything a protocol module needs from the engine is here: the public model id, the context
limit, the tokenizer and chat template of the artifact, the sampler defaults (model preset then
process flags), `submit()`, and the latest `EngineStats` snapshot.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, Sequence

from .stats import EngineStats
from .types import EngineState, GenerationRequest, SamplingParams, TokenEvent


class TextTokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    vocab_size: int  # token ids are 0 .. vocab_size - 1 (a client's prompt ids are checked)

    def encode(self, text: str) -> list[int]: ...

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text; may run without the GIL (`http.prompt_encoder`)."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ChatRenderer(Protocol):
    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: object,
    ) -> str:
        """Render OpenAI-shaped messages (role/content/tool_calls) to the prompt text."""
        ...


class ServingEngine(Protocol):
    model_id: str
    max_context: int
    tokenizer: TextTokenizer
    chat_template: ChatRenderer
    sampling_defaults: SamplingParams  # model preset then process flags
    thinking_sampling_defaults: SamplingParams  # the same when the prompt opens thinking
    default_max_tokens: int
    turn_anchors: int  # `--turn-anchors` (`GenerationRequest.anchors`)
    # `vision.tower.MediaPlanner` under `--vision` (the preprocessor and `prepare`), else None
    media_planner: Any

    @property
    def state(self) -> EngineState: ...

    def snapshot(self) -> EngineStats: ...

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Queue a request; iterate its events on the caller's event loop.

        Closing the iterator early (client disconnect) cancels the request at the next engine
        step and frees its resources. The last event always carries `finish`. An engine may
        mark admission with an empty first event (no text, no finish): streams start there.
        Our engines return a `step.event_pump.EventStream`, whose `wait` and `take` hand a
        reader every event that already arrived at once; any async iterator will do.
        """
        ...
