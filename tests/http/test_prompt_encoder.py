"""`PromptEncoder`: long prompts are encoded off the event loop, each on its own worker thread
(a burst's side by side), with the ids `encode` gives; a failure reaches only its request."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ninfer_http.prompt_encoder import INLINE_CHARS, PromptEncoder

from fake_engine import CharTokenizer

LONG = "a" * INLINE_CHARS


class GatedTokenizer(CharTokenizer):
    """Records each `encode_many` call and its thread; a text starting with "wait" blocks its
    call until `gate` opens, one with "bad" fails."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self.calls.append(list(texts))
        if texts[0].startswith("wait"):
            assert self.gate.wait(10)
        if texts[0].startswith("bad"):
            raise ValueError("cannot encode")
        return super().encode_many(texts)


def test_a_burst_s_prompts_are_encoded_side_by_side_off_the_loop():
    """A prompt whose encoding is held up holds up no other: each runs on its own thread."""
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        held = asyncio.ensure_future(encoder.encode(tok, f"wait{LONG}"))
        texts = [f"{i}{LONG}" for i in range(6)]
        ids = await asyncio.wait_for(asyncio.gather(
            *(encoder.encode(tok, text) for text in texts)), 10)
        assert not held.done()
        tok.gate.set()
        held_ids = await held
        encoder.close()
        return tok, texts, ids, held_ids

    tok, texts, ids, held_ids = asyncio.run(scenario())
    assert ids == [tok.encode(text) for text in texts]
    assert held_ids == tok.encode(f"wait{LONG}")
    assert sorted(tok.calls) == sorted([[f"wait{LONG}"], *([text] for text in texts)])
    assert len(tok.threads) > 1 and all("ninfer-encode" in name for name in tok.threads)


def test_short_prompts_are_encoded_in_place():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        ids = await encoder.encode(tok, "short")
        encoder.close()
        return tok, ids

    tok, ids = asyncio.run(scenario())
    assert ids == tok.encode("short") and tok.calls == []


def test_a_failing_prompt_fails_its_request_alone():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        bad, good = (asyncio.ensure_future(encoder.encode(tok, text))
                     for text in (f"bad{LONG}", LONG))
        with pytest.raises(ValueError, match="cannot encode"):
            await bad
        ids = await good
        after = await encoder.encode(tok, f"x{LONG}")
        encoder.close()
        return tok, ids, after

    tok, ids, after = asyncio.run(scenario())
    assert ids == tok.encode(LONG) and after == tok.encode(f"x{LONG}")


def test_a_request_cancelled_while_encoding_leaves_the_others_intact():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        gone = asyncio.ensure_future(encoder.encode(tok, f"wait{LONG}"))
        kept = asyncio.ensure_future(encoder.encode(tok, f"y{LONG}"))
        await asyncio.sleep(0.05)
        gone.cancel()
        tok.gate.set()
        result = await kept
        encoder.close()
        return tok, result, gone

    tok, kept, gone = asyncio.run(scenario())
    assert gone.cancelled() and kept == tok.encode(f"y{LONG}")


def test_a_prompt_sent_after_the_encoder_closed_fails_instead_of_waiting():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        encoder.close()
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(encoder.encode(tok, LONG), 5)
        assert tok.calls == []

    asyncio.run(scenario())
