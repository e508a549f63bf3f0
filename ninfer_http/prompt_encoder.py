"""Prompt texts to token ids off the event loop, each prompt on its own worker thread.

Encoding a 4K-character prompt takes ~1-2 ms of the `tokenizers` runtime. On the event loop, a
burst of eight such requests was tokenized one after the other while nothing else ran: the
last one reached the engine ~20 ms after it arrived, and streams in flight waited to be
written. Here each long prompt is encoded as it arrives, on one of a pool of threads, through
`encode_many([text])` (`encode_batch`, which runs without the GIL), so the prompts of a burst
are encoded side by side. An earlier version queued them for one `encode_batch` call on one
worker (vLLM's `AsyncMicrobatchTokenizer` batches so): a burst's prompts read over several
turns of the loop then waited for the batch before them, and on the H100's 8-layer 35B-A3B
burst of eight 1K-token prompts their preparation took 3.6-4.4 ms (median from arrival)
against 2.6-3.4 ms here, servers alternated in one call (bench/results/
h100-ttft-burst-threads.md). Short texts are encoded in place: the hand-over to a thread
and back costs about what they take.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ninfer_engine.client import TextTokenizer as Tokenizer

INLINE_CHARS = 2048  # below this, encoding (<~1 ms) costs about the thread hand-over
WORKERS = 8  # prompts encoded at once: a burst of --max-concurrency's most (8)


class PromptEncoder:
    """`await encode(tokenizer, text)`: the ids `tokenizer.encode(text)` returns."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ninfer-encode")

    async def encode(self, tokenizer: Tokenizer, text: str) -> list[int]:
        if len(text) < INLINE_CHARS:
            return tokenizer.encode(text)
        loop = asyncio.get_running_loop()
        (ids,) = await loop.run_in_executor(self._workers, tokenizer.encode_many, [text])
        return ids

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)


ENCODER = web.AppKey("prompt_encoder", PromptEncoder)


def install(app: web.Application) -> None:
    """The app's encoder, closed with the app."""
    app[ENCODER] = PromptEncoder()

    async def close(app: web.Application) -> None:
        app[ENCODER].close()
    app.on_cleanup.append(close)
