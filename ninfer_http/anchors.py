"""Where a prompt's reusable prefixes end (`GenerationRequest.anchors`), found by rendering the
conversation up to a message and checking its tokens start the prompt's.

- `--turn-anchors N`: the last N message boundaries before the final message, so a
  conversation whose last turn is edited, retried or cancelled resumes from the turn before
  ("private_turn_closure");
- an Anthropic `cache_control` breakpoint: the end of the message that carries it, or of the
  leading system messages for one on a tool or a system block ("shared_stable_prefix");
- a Responses `prompt_cache_key`: the end of the leading system (instructions) messages, the
  part its conversations share ("shared_stable_prefix").

The hybrid family snapshots its recurrent state there (a prompt chunk ends at each anchor); the
llama family reuses any page boundary anyway. A boundary whose rendering is not a prefix of the
prompt's (a template that rewrites earlier turns) is skipped.
"""
from __future__ import annotations

from typing import Any

TURN = "private_turn_closure"
SHARED = "shared_stable_prefix"
MAX_ANCHORS = 6  # each costs a render, a tokenization and a prompt chunk cut
SYSTEM_ROLES = ("system", "developer")


def prompt_anchors(engine: Any, request: Any, prompt_ids: list[int]) -> tuple[tuple[int, str], ...]:
    """(prompt position, reuse path) of each anchor of `request` (a `prompt.ChatRequest`)."""
    messages = request.messages
    count = len(messages)
    lead = next((i for i, m in enumerate(messages) if m.get("role") not in SYSTEM_ROLES), count)
    ends: dict[int, str] = {}
    turns = getattr(engine, "turn_anchors", 0)
    for end in range(max(count - turns, 1), count):
        ends[end] = TURN
    shared = [lead if b < 0 else b + 1 for b in request.breakpoints]
    if request.session_key:
        shared.append(lead)
    for end in shared:
        if 0 < end <= count:
            ends[end] = SHARED
    anchors = []
    for end, kind in sorted(ends.items())[-MAX_ANCHORS:]:
        try:
            text = engine.chat_template.render(messages[:end], tools=request.tools,
                                               add_generation_prompt=False,
                                               **request.template_kwargs)
        except Exception:  # a template that needs the whole conversation: no anchor here
            continue
        ids = engine.tokenizer.encode(text)
        if 0 < len(ids) < len(prompt_ids) and list(prompt_ids[: len(ids)]) == list(ids):
            anchors.append((len(ids), kind))
    return tuple(anchors)
