"""One `POST /v1/responses` (or `input_tokens`) body -> a `Turn`: its parsed fields, the
stored conversation of `previous_response_id` plus this request's items, and the `ChatRequest`
over them (`instructions` first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_engine.client import ServingEngine
from ninfer_engine.config import EngineConfig

from .prompt import ChatRequest
from .reasoning_seal import ReasoningSeal
from .responses_items import Conversation
from .responses_request import ResponsesRequest, check_model, parse_create
from .responses_shapes import item_id
from .responses_store import ResponseStore
from .validate import parse_json_object

PROTOCOL = "openai-responses"


@dataclass(frozen=True)
class Turn:
    """One parsed request: its fields, its conversation and what it inherits."""

    id: str
    parsed: ResponsesRequest
    conversation: Conversation
    chat: ChatRequest
    session_key: str
    preserve_thinking: bool | None  # the root's, stored for later continuations
    history: list[dict[str, Any]]  # the earlier turns' input and output items (input_items)

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """Every item used to generate this response: earlier turns', then this request's."""
        return [*self.history, *self.conversation.items]


def _with_instructions(instructions: str | None, messages: list[dict[str, Any]]
                       ) -> list[dict[str, Any]]:
    # Instructions belong to this request only; they join a leading system message if any.
    if not instructions:
        return messages
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{instructions}\n\n{messages[0]['content']}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]


def parse_turn(raw: bytes, engine: ServingEngine, config: EngineConfig, store: ResponseStore,
               seal: ReasoningSeal, model_required: bool) -> Turn:
    body = parse_json_object(raw)
    parsed = parse_create(body, config)
    check_model(parsed.model, engine.model_id, model_required)
    previous = None
    if parsed.previous_response_id is not None:
        previous = store.get(parsed.previous_response_id, param="previous_response_id")
    conversation = Conversation(previous.conversation if previous else (), seal.open)
    conversation.add_all(parsed.input)
    kwargs = dict(parsed.template_kwargs)
    preserve = kwargs.get("preserve_thinking")
    if previous is not None and not parsed.preserve_thinking_set:
        preserve = previous.preserve_thinking
        kwargs.pop("preserve_thinking", None)
        if preserve is not None:
            kwargs["preserve_thinking"] = preserve
    response_id = item_id("resp_")
    # a chain shares its root's key; Codex names its thread with prompt_cache_key instead
    session_key = parsed.prompt_cache_key or (previous.session_key if previous else response_id)
    chat = ChatRequest(
        protocol=PROTOCOL,
        messages=_with_instructions(parsed.instructions, conversation.messages),
        tools=parsed.tools.template,
        max_tokens=parsed.max_output_tokens,
        sampling=parsed.sampling,
        template_kwargs=kwargs,
        stream=parsed.stream,
        thinking=parsed.thinking,
        thinking_budget=config.default_thinking_budget,
        grammar=parsed.grammar,
        grammar_param=parsed.tools.param,
        parallel_tool_calls=parsed.parallel_tool_calls,
        session_key=session_key,
        logprobs=parsed.logprobs,
    )
    history = [*previous.input_items, *previous.response["output"]] if previous else []
    return Turn(response_id, parsed, conversation, chat, session_key,
                 previous.preserve_thinking if previous else preserve, history)
