"""`Supervisor`: owns the engine's life (load, failure, reload, profile switch, drain).

It is also the `ServingEngine` the HTTP layer holds: it forwards to the current engine, so a
reload swaps engines under a server that keeps listening and answers 503 meanwhile. Every
request passes its `AdmissionGate` (pause, drain) and ends in its `RequestLedger` (latency,
reasons, recent requests), both of which outlive reloads. The stream `submit` returns is
`gated_stream.GatedStream`; the engine is built by an `engine_factory.EngineFactory`.
"""
from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from dataclasses import replace
from typing import Callable

from .admission_gate import AdmissionGate
from .cli.capabilities import Machine, check_features, probe_machine
from .config import EngineConfig
from .cli.flags import parse_args
from .engine_factory import EngineFactory, _default_factory
from .gated_stream import GatedStream
from .request_ledger import RequestLedger, ended_view, with_client
from .stats import EngineStats, QueueStats, Throughput
from .types import EngineState, GenerationRequest, SamplingParams, TokenEvent

DRAIN_POLL_S = 0.05


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
        self.gate = AdmissionGate()
        self.ledger = RequestLedger()
        self._clients: dict[str, str | None] = {}  # request id -> client label, while it runs
        self._cancelled: set[str] = set()  # ids the operator cancelled in the engine
        self._stopping = False
        self.cut_off = 0  # requests that `stop()` ended with an error (a drain that ran out)

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
        # an injected fault (tests, drills) breaks the engine loaded first, not its reloads
        os.environ.pop("NINFER_FAULT", None)
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
            del old
            _release_memory()  # the old model's pages go back before the new one is read
        self.load()

    def stop(self) -> None:
        """Stop the engine; whatever still runs ends with 503 (counted in `cut_off` once its
        consumer has read that end)."""
        self._stopping = True
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
    @property
    def paused(self) -> bool:
        return self.gate.state != "open"

    def pause_admission(self) -> None:
        self.gate.pause()

    def resume_admission(self) -> None:
        self.gate.resume()

    def cancel(self, request_id: str) -> bool:
        """End one waiting, queued or running request (503 to its client); False if unknown."""
        if self.gate.cancel(request_id):
            return True
        engine = self._engine
        if engine is None or not hasattr(engine, "cancel") or not engine.cancel(request_id):
            return False
        self._cancelled.add(request_id)
        return True

    def refuse(self) -> None:
        """New requests get 503 from now on (a graceful stop's first act; `drain` waits)."""
        self.gate.close()

    def drain(self, timeout_s: float) -> int:
        """Graceful stop, blocking: refuse new requests, end those waiting at a paused gate, give
        the ones in the engine (running or queued there) up to `timeout_s` to finish. Returns how
        many are left (`stop()` ends them with an in-band 503)."""
        self.gate.close()
        engine = self._engine
        if engine is None:
            return 0
        deadline = time.monotonic() + timeout_s
        while True:
            queue = engine.snapshot().queue
            left = len(queue.running) + len(queue.pending)
            if not left or time.monotonic() >= deadline or self.state is not EngineState.READY:
                return left
            time.sleep(DRAIN_POLL_S)

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
    def turn_anchors(self) -> int:
        """`--turn-anchors`: message boundaries a request's prompt is snapshotted at."""
        return self.config.turn_anchors

    @property
    def tokenizer(self):
        return self._current().tokenizer

    @property
    def chat_template(self):
        return self._current().chat_template

    @property
    def media_planner(self):
        return self._current().media_planner

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
        """The engine's latest snapshot with the gate's waiters, the ledger's figures and the
        client labels; live figures are cleared unless the engine is READY (never stale)."""
        engine, state = self._engine, self.state
        base = engine.snapshot() if engine is not None else EngineStats(at=time.time(), state="")
        if engine is None or state is not EngineState.READY:
            base = replace(base, at=time.time(), state=state.value, failure=self._failure,
                           model_id=self.model_id, profile=self.profile,
                           started_at=base.started_at or self.started_at,
                           throughput=Throughput(),
                           queue=QueueStats(), kv=replace(base.kv, used=0, per_request=()))
        clients = dict(self._clients)
        queue = base.queue
        queue = QueueStats(
            pending=(*self.gate.waiting(time.monotonic()),
                     *(with_client(v, clients) for v in queue.pending)),
            running=tuple(with_client(v, clients) for v in queue.running),
            recent=self.ledger.recent())
        return replace(base, queue=queue, latency=self.ledger.latency(),
                       admission=self.gate.state, max_context=self.config.max_context)

    def record_rejection(self, request_id: str, code: str | None, client: str | None) -> None:
        """The front end refused a request before it reached `submit()` (429, 503 not ready)."""
        self.ledger.rejected(request_id, code, client)

    def submit(self, request: GenerationRequest) -> GatedStream:
        """Forward to the engine through the gate (paused: wait in line up to the queue
        deadline; draining: 503) and record the request's end in the ledger."""
        return GatedStream(self, request)

    def _record(self, rid: str, prompt: int, arrived: float, client: str | None,
                last: TokenEvent | None) -> None:
        view = ended_view(rid, prompt, arrived, client, last, time.monotonic())
        if rid in self._cancelled:
            self._cancelled.discard(rid)
            view = replace(view, reason="cancelled_by_operator")
        elif self._stopping and view.phase == "error":
            self.cut_off += 1
        self.ledger.record(view)


def _release_memory() -> None:
    """Collect the dropped engine and hand freed heap pages back to the OS (glibc keeps them
    otherwise, and the process would grow by about a model per reload)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


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
