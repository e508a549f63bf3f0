"""`<think>` splitting over every chunk boundary (ninfer_engine.chat.reasoning)."""
from __future__ import annotations

import random

import pytest

from ninfer_engine.chat.reasoning import ReasoningSplitter


def split(text: str, cuts: list[int], opened: bool = False) -> tuple[str, str, list[str]]:
    """Feed `text` cut at `cuts`; the joined reasoning, the joined content, the channel order."""
    splitter = ReasoningSplitter(opened=opened)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    out = [d for piece in pieces for d in splitter.feed(piece)] + splitter.flush()
    reasoning = "".join(t for c, t in out if c == "reasoning")
    content = "".join(t for c, t in out if c == "content")
    order = [c for i, (c, _) in enumerate(out) if i == 0 or out[i - 1][0] != c]
    return reasoning, content, order


def every_split(text: str, opened: bool = False) -> set[tuple[str, str, tuple[str, ...]]]:
    """Results of one character at a time, every single cut, and random multi-cuts."""
    results = set()
    rng = random.Random(7)
    cut_sets = [list(range(1, len(text)))] + [[i] for i in range(1, len(text))]
    cut_sets += [sorted(rng.sample(range(1, len(text)), rng.randint(1, min(6, len(text) - 1))))
                 for _ in range(40)]
    for cuts in cut_sets:
        reasoning, content, order = split(text, cuts, opened)
        results.add((reasoning, content, tuple(order)))
    return results


CASES = [
    # (output, prompt opened thinking, reasoning, content)
    ("<think>\nLet me think.\n</think>\n\nHello!", False, "Let me think.", "Hello!"),
    ("  <think>a</think>b", False, "a", "b"),
    ("Let me think.\n</think>\n\nHello!", True, "Let me think.", "Hello!"),
    ("I wonder </thin k> if </think>done", True, "I wonder </thin k> if", "done"),
    ("Hello <think>not here</think>", False, "", "Hello <think>not here</think>"),
    ("<thinking>no</thinking>", False, "", "<thinking>no</thinking>"),
    ("<thi", False, "", "<thi"),
    ("still thinking when cut off", True, "still thinking when cut off", ""),
    ("<think>cut off mid </thi", False, "cut off mid </thi", ""),
    ("</think>Only answer", True, "", "Only answer"),
    ("x < y and <think", False, "", "x < y and <think"),
    ("<think>\n\n</think>\n\n", False, "", ""),
    ("\u00e9t\u00e9 \U0001F600</think>ok", True, "\u00e9t\u00e9 \U0001F600", "ok"),
]


@pytest.mark.parametrize("text, opened, reasoning, content", CASES)
def test_every_chunk_boundary_gives_the_same_split(text, opened, reasoning, content):
    expected_order = tuple(c for c, t in (("reasoning", reasoning), ("content", content)) if t)
    assert every_split(text, opened) == {(reasoning, content, expected_order)}


@pytest.mark.parametrize("text", ["<think>a</think>b", "x</think>y"])
def test_no_tag_ever_leaks_into_a_delta(text):
    opened = not text.startswith("<think>")
    for cuts in [list(range(1, len(text)))] + [[i] for i in range(1, len(text))]:
        splitter = ReasoningSplitter(opened=opened)
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        deltas = [d for piece in pieces for d in splitter.feed(piece)] + splitter.flush()
        assert all("<" not in t and ">" not in t for _, t in deltas), cuts


def test_held_text_is_released_as_soon_as_it_is_decided():
    splitter = ReasoningSplitter(opened=True)
    assert splitter.feed("abc </th") == [("reasoning", "abc")]
    assert splitter.feed("ing") == [("reasoning", " </thing")]
    assert splitter.feed("</think>") == []
    assert not splitter.in_reasoning
    assert splitter.feed("\nHi") == [("content", "Hi")]


def test_in_reasoning_follows_the_tags():
    splitter = ReasoningSplitter()
    assert not splitter.in_reasoning
    splitter.feed("<think>")
    assert splitter.in_reasoning
    splitter.feed("x</think>")
    assert not splitter.in_reasoning
    assert ReasoningSplitter().feed("plain") == [("content", "plain")]
