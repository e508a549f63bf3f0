"""`PromptEncoder`: long prompts are encoded off the event loop, those queued together in one
`encode_many` call, with the ids `encode` gives; a failure reaches only its own requests."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ninfer_http.prompt_encoder import INLINE_CHARS, PromptEncoder

from fake_engine import CharTokenizer

LONG = "a" * INLINE_CHARS


class GatedTokenizer(CharTokenizer):
    """Records each `encode_many` batch; the first one waits until `gate` opens."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.fail_on = fail_on

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(texts))
        if len(self.batches) == 1:
            assert self.gate.wait(10)
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError("cannot encode")
        return super().encode_many(texts)


async def _until(condition, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_prompts_arriving_together_are_encoded_in_one_call_off_the_loop():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        texts = [f"{i}{LONG}" for i in range(6)]
        first = asyncio.ensure_future(encoder.encode(tok, texts[0]))
        await _until(lambda: len(tok.batches) == 1)  # the worker holds the first one
        # the loop runs while the worker encodes: these queue behind it
        rest = [asyncio.ensure_future(encoder.encode(tok, text)) for text in texts[1:]]
        await asyncio.sleep(0.05)
        assert not first.done()
        tok.gate.set()
        ids = await asyncio.gather(first, *rest)
        encoder.close()
        return tok, texts, ids

    tok, texts, ids = asyncio.run(scenario())
    assert ids == [tok.encode(text) for text in texts]
    assert tok.batches == [texts[:1], texts[1:]]
    assert tok.threads == {next(iter(tok.threads))} and "ninfer-encode" in next(iter(tok.threads))


def test_short_prompts_are_encoded_in_place():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        ids = await encoder.encode(tok, "short")
        encoder.close()
        return tok, ids

    tok, ids = asyncio.run(scenario())
    assert ids == tok.encode("short") and tok.batches == []


def test_a_failing_batch_fails_its_requests_and_the_next_ones_are_encoded():
    bad = f"bad{LONG}"

    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer(fail_on=bad)
        tok.gate.set()
        with pytest.raises(ValueError, match="cannot encode"):
            await encoder.encode(tok, bad)
        ids = await encoder.encode(tok, LONG)
        encoder.close()
        return tok, ids

    tok, ids = asyncio.run(scenario())
    assert ids == tok.encode(LONG)


def test_a_request_cancelled_while_queued_leaves_the_others_intact():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        first = asyncio.ensure_future(encoder.encode(tok, LONG))
        await _until(lambda: len(tok.batches) == 1)
        gone = asyncio.ensure_future(encoder.encode(tok, f"x{LONG}"))
        kept = asyncio.ensure_future(encoder.encode(tok, f"y{LONG}"))
        await asyncio.sleep(0)
        gone.cancel()
        tok.gate.set()
        result = await asyncio.gather(first, kept)
        encoder.close()
        return tok, result, gone

    tok, (first, kept), gone = asyncio.run(scenario())
    assert gone.cancelled()
    assert first == tok.encode(LONG) and kept == tok.encode(f"y{LONG}")


def test_prompts_whose_requests_are_read_in_one_turn_of_the_loop_share_one_call():
    """Eight requests of a burst reach `encode` in one turn of the loop: one `encode_many` of
    all eight, not the first alone and the rest after it."""
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        tok.gate.set()
        texts = [f"{i}{LONG}" for i in range(8)]
        ids = await asyncio.gather(*(encoder.encode(tok, text) for text in texts))
        encoder.close()
        return tok, texts, ids

    tok, texts, ids = asyncio.run(scenario())
    assert ids == [tok.encode(text) for text in texts]
    assert tok.batches == [texts]


def test_a_batch_queued_as_the_encoder_closes_fails_instead_of_waiting():
    async def scenario():
        encoder, tok = PromptEncoder(), GatedTokenizer()
        pending = asyncio.ensure_future(encoder.encode(tok, LONG))
        await asyncio.sleep(0)  # queued; its drain starts on the next turn
        encoder.close()
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(pending, 5)
        assert tok.batches == []

    asyncio.run(scenario())
