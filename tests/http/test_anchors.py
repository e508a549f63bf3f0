"""`ninfer_http.anchors`: where a prompt's reusable prefixes end — the last `--turn-anchors`
message boundaries, Anthropic cache_control breakpoints and the instructions before a Responses
prompt_cache_key conversation — found by rendering up to a message (the recording template and
one token per character: a position is a length of rendered text)."""
from __future__ import annotations

from types import SimpleNamespace

from ninfer_http.anchors import SHARED, TURN, prompt_anchors
from ninfer_http.prompt import ChatRequest

from tests.http.fake_engine import CharTokenizer, RecordingTemplate

MESSAGES = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "next"}]


def _engine(turns: int, template=None):
    return SimpleNamespace(chat_template=template or RecordingTemplate(),
                           tokenizer=CharTokenizer(), turn_anchors=turns)


def _anchors(engine, **fields):
    request = ChatRequest(protocol="anthropic", messages=MESSAGES, **fields)
    prompt = engine.tokenizer.encode(engine.chat_template.render(MESSAGES))
    return prompt_anchors(engine, request, prompt)


def _end(count: int) -> int:
    """The rendered length of the first `count` messages."""
    return sum(len(f"<{m['role']}>{m['content']}\n") for m in MESSAGES[:count])


def test_turn_anchors_are_the_last_boundaries_before_the_final_message():
    assert _anchors(_engine(0)) == ()
    assert _anchors(_engine(1)) == ((_end(3), TURN),)
    assert _anchors(_engine(2)) == ((_end(2), TURN), (_end(3), TURN))


def test_breakpoints_and_a_session_key_mark_shared_prefixes():
    # a breakpoint on the first user message, one on a tool (-1: the system messages' end)
    assert _anchors(_engine(0), breakpoints=(1, -1)) == ((_end(1), SHARED), (_end(2), SHARED))
    assert _anchors(_engine(0), session_key="conv") == ((_end(1), SHARED),)
    # a boundary both a turn and a breakpoint is shared; the last message's end is the prompt's
    # own (rendered without the generation prompt): a prefix, so an anchor too
    assert _anchors(_engine(1), breakpoints=(2, 3)) == ((_end(3), SHARED), (_end(4), SHARED))


class RewritingTemplate(RecordingTemplate):
    """A template that renders earlier turns differently once the conversation goes on."""

    def render(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
        text = super().render(messages, tools, add_generation_prompt, **kwargs)
        return text if add_generation_prompt else text.upper()


def test_a_boundary_whose_rendering_is_not_a_prefix_is_skipped():
    assert _anchors(_engine(2, RewritingTemplate()), session_key="conv") == ()
