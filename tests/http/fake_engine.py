"""A scripted `ServingEngine` for HTTP tests.

It tokenizes one id per character, renders messages with a trivial template (recording every
call), emits the text pieces of its `Script`, and records submitted requests and cancellations.
The server runs on another thread's event loop, so observers use thread-safe primitives.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import AsyncIterator, Sequence

from ninfer_engine.config import EngineConfig
from ninfer_engine.stats import EngineStats
from ninfer_engine.types import (
    EngineError,
    EngineState,
    GenerationRequest,
    SamplingParams,
    Timings,
    TokenEvent,
    Usage,
)

# The periodic throughput logger is off so tests only see their own log lines.
FAKE_CONFIG = EngineConfig(artifact=Path("fake.ninfer"), log_stats_interval_ms=0)


class CharTokenizer:
    """One token per character, so prompt lengths are easy to reason about."""

    eos_token_ids = (0,)
    vocab_size = 0x110000  # every Unicode code point

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


class RecordingTemplate:
    """`<role>content` lines plus `<assistant>`; remembers what it was given."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def render(self, messages, tools=None, add_generation_prompt=True, **template_kwargs) -> str:
        if add_generation_prompt:  # the prompt's render, not an anchor's (`ninfer_http.anchors`)
            self.calls.append({"messages": messages, "tools": tools, "kwargs": template_kwargs})
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass
class Script:
    """What the next requests produce."""

    pieces: tuple[str, ...] = ("Hello", ", ", "world", "!")
    finish: str = "stop"
    stop_sequence: str | None = None
    cached_tokens: int = 0
    delay_s: float = 0.0  # before each piece
    reject: EngineError | None = None  # the first event is this error (admission failure)
    fail: EngineError | None = None  # after the pieces, this error instead of a finish
    hang: bool = False  # after the pieces, wait until cancelled
    crash: bool = False  # after the pieces, raise (an engine bug, not an error event)
    progress: tuple[tuple[int, int, int], ...] = ()  # before the pieces, if the request asks
    timings: Timings = field(
        default_factory=lambda: Timings(prefill_s=0.02, decode_s=0.03, prompt_n=10, predicted_n=4)
    )


class FakeEngine:
    """Implements `ninfer_engine.client.ServingEngine` from a `Script`."""

    def __init__(self, script: Script | None = None) -> None:
        self.model_id = "fake-model"
        self.max_context = 256
        self.default_max_tokens = 64
        self.tokenizer = CharTokenizer()
        self.chat_template = RecordingTemplate()
        self.sampling_defaults = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)
        self.thinking_sampling_defaults = SamplingParams(temperature=1.0, top_p=0.95, top_k=20)
        self.media_planner = None  # no media input (`--vision` off)
        self.script = script or Script()
        self.current_state = EngineState.READY
        self.submitted: list[GenerationRequest] = []
        self.cancelled: list[str] = []
        self.cancel_seen = threading.Event()

    @property
    def state(self) -> EngineState:
        return self.current_state

    def snapshot(self) -> EngineStats:
        return EngineStats(at=time.time(), state=self.current_state.value, model_id=self.model_id)

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self.submitted.append(request)
        return self._events(request, self.script)

    async def _events(
        self, request: GenerationRequest, script: Script
    ) -> AsyncIterator[TokenEvent]:
        finished = False
        try:
            if script.reject is not None:
                finished = True
                yield TokenEvent(finish="error", error=script.reject)
                return
            if request.report_progress:
                for progress in script.progress:
                    yield TokenEvent(progress=progress)
            for i, piece in enumerate(script.pieces):
                if script.delay_s:
                    await asyncio.sleep(script.delay_s)
                # running timings as the engine sends them: the script's, counted so far
                yield TokenEvent(text=piece, token_ids=(i + 1,),
                                 timings=replace(script.timings, predicted_n=i + 1))
            if script.hang:
                await asyncio.Event().wait()
            if script.crash:
                finished = True
                raise RuntimeError("scripted engine crash")
            finished = True
            if script.fail is not None:
                yield TokenEvent(finish="error", error=script.fail)
                return
            usage = Usage(len(request.prompt_ids), len(script.pieces), script.cached_tokens)
            yield TokenEvent(finish=script.finish, stop_sequence=script.stop_sequence,
                             usage=usage, timings=script.timings)
        finally:
            if not finished:
                self.cancelled.append(request.request_id)
                self.cancel_seen.set()
