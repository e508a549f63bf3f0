"""`Supervisor`: owns the engine's life (load, failure, reload, profile switch).

It is also the `ServingEngine` the HTTP layer holds: it forwards to the current engine, so a
reload swaps engines under a server that keeps listening and answers 503 meanwhile.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import AsyncIterator, Callable

from .capabilities import Machine, check_features, probe_machine
from .config import EngineConfig
from .flags import parse_args
from .stats import EngineStats
from .types import EngineError, EngineState, GenerationRequest, SamplingParams, TokenEvent

ADMISSION_POLL_S = 0.05
EngineFactory = Callable[[EngineConfig], object]


def _default_factory(config: EngineConfig):
    from .engine import Engine  # torch is imported only when an engine is really built

    return Engine(config)


class Supervisor:
    """Loads one engine from `argv`; reloads it, optionally under another profile."""

    def __init__(
        self,
        argv: list[str],
        *,
        engine_factory: EngineFactory = _default_factory,
        on_failure: Callable[[str], None] | None = None,
        machine: Machine | None = None,
    ) -> None:
        self._user_argv = list(argv)
        parsed = parse_args(argv)
        self.config: EngineConfig = parsed.config
        self._explicit = parsed.explicit
        self._factory = engine_factory
        self._on_failure = on_failure
        self._machine = machine
        self._engine = None
        self._state = EngineState.LOADING
        self._failure: str | None = None
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.paused = False

    # -- life -------------------------------------------------------------------------------
    def load(self) -> None:
        """Build and start the engine (blocking). A load error leaves the state FAILED and
        propagates to the caller."""
        try:
            engine = self._factory(self.config)
        except Exception as exc:
            with self._lock:
                self._state, self._failure = EngineState.FAILED, f"load failed: {exc}"
            raise
        if hasattr(engine, "add_failure_listener"):
            engine.add_failure_listener(self._engine_failed)
        engine.start()
        with self._lock:
            self._engine, self._state, self._failure = engine, EngineState.READY, None

    def reload(self, profile: str | None = None) -> None:
        """Stop the current engine and load a new one (with `profile`'s flags when given)."""
        if profile is not None:
            parsed = self._parse_with_profile(profile)
            self.config, self._explicit = parsed.config, parsed.explicit
        with self._lock:
            old, self._engine = self._engine, None
            self._state = EngineState.RELOADING
        if old is not None:
            old.stop()
        self.load()

    def stop(self) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
            self._state = EngineState.STOPPED
        if engine is not None:
            engine.stop()

    def _engine_failed(self, reason: str) -> None:
        with self._lock:
            self._state, self._failure = EngineState.FAILED, reason
        if self._on_failure is not None:
            self._on_failure(reason)

    # -- profiles ---------------------------------------------------------------------------
    @property
    def profile(self) -> str | None:
        return self.config.profile

    def _parse_with_profile(self, profile: str):
        has_artifact = bool(self._user_argv) and not self._user_argv[0].startswith("-")
        rest = self._user_argv[1:] if has_artifact else self._user_argv
        return parse_args([str(self.config.artifact), "--profile", profile, *_strip_profile(rest)])

    def check_profile(self, profile: str) -> str | None:
        """None when `profile` can run on this machine, else the one-line reason."""
        try:
            parsed = self._parse_with_profile(profile)
            check_features(parsed.config, parsed.explicit, self._machine or probe_machine())
        except Exception as exc:
            return str(exc)
        return None

    # -- admission --------------------------------------------------------------------------
    def pause_admission(self) -> None:
        self.paused = True

    def resume_admission(self) -> None:
        self.paused = False

    # -- ServingEngine ----------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        with self._lock:
            if self._state is EngineState.READY and self._engine is not None:
                return self._engine.state
            return self._state

    @property
    def failure(self) -> str | None:
        return self._failure

    def _current(self):
        engine = self._engine
        if engine is None:
            raise RuntimeError("the engine is not loaded")
        return engine

    @property
    def model_id(self) -> str:
        return self._engine.model_id if self._engine else (self.config.model_id or "")

    @property
    def max_context(self) -> int:
        return self.config.max_context

    @property
    def tokenizer(self):
        return self._current().tokenizer

    @property
    def chat_template(self):
        return self._current().chat_template

    @property
    def sampling_defaults(self) -> SamplingParams:
        return self._current().sampling_defaults

    @property
    def thinking_sampling_defaults(self) -> SamplingParams:
        return self._current().thinking_sampling_defaults

    @property
    def default_max_tokens(self) -> int:
        """The engine's resolved limit (flag, else the artifact's generation config)."""
        return self._current().default_max_tokens

    def snapshot(self) -> EngineStats:
        engine, state = self._engine, self.state
        if engine is not None and state is not EngineState.FAILED:
            return engine.snapshot()
        base = engine.snapshot() if engine is not None else EngineStats(at=time.time(), state="")
        return replace(base, at=time.time(), state=state.value, failure=self._failure,
                       model_id=self.model_id, profile=self.profile, started_at=self.started_at)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Forward to the engine; while admission is paused, wait in line (up to the queue
        deadline) instead of being admitted."""
        deadline = time.monotonic() + self.config.pending_timeout_ms / 1000
        while self.paused:
            if time.monotonic() >= deadline:
                yield TokenEvent(finish="error", error=EngineError(
                    "admission is paused and the request was not admitted in time",
                    "request_queue_timeout", 503))
                return
            await asyncio.sleep(ADMISSION_POLL_S)
        events = self._current().submit(request)
        try:
            async for event in events:
                yield event
        finally:  # an early close must reach the engine now, so it cancels at the next step
            await events.aclose()


def _strip_profile(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--profile":
            skip = True
            continue
        if not a.startswith("--profile="):
            out.append(a)
    return out
