"""`EngineProcess`: the `ServingEngine` (client.py) of an `Engine` that runs in a process of its
own, so its step loop and the HTTP loop do not take turns on one GIL.

In one process the engine thread's host work (schedule, sample, detokenize) and the HTTP
loop's (JSON, SSE writes) share the GIL: at batch 8 on the H200 they add up to more than the
GPU step, and served throughput falls to a fraction of the engine's own step rate (vLLM v1
splits its API server from `EngineCore` for the same reason). Here the engine process runs
`Engine` unchanged; one pipe carries requests and cancels down, and one message per step up:
that step's token events, the stats snapshot when it changed, log records, a failure.

The parent holds the tokenizer and chat template (sent once at start) and an `EventStream`
per request, fed by a reader thread with one `call_soon_threadsafe` per loop per step, as
`EventPump` does in one process. A child that dies fails its requests with 503 and the engine
with the exit status; `Supervisor` reloads it like any failed engine.
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import multiprocessing as mp
import pickle
import threading
from typing import Callable

from .arrival import current_arrival
from .config import EngineConfig
from .engine_load import EngineLoadError
from .engine_process_child import EngineInfo, child_main, unavailable
from .stats import EngineStats
from .step.event_pump import EventStream, hand_over
from .types import EngineError, EngineState, GenerationRequest, TokenEvent

STOP_GRACE_S = 5.0  # past `stop`'s timeout, before the child is killed

log = logging.getLogger(__name__)


class EngineProcess:
    """Starts the engine process and waits for its load (an `EngineLoadError` if it fails)."""

    def __init__(self, config: EngineConfig) -> None:
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            # the server sets the level of `ninfer` (`configure_logging`), not the root's
            target=child_main, args=(config, child,
                                     logging.getLogger("ninfer").getEffectiveLevel()),
            name="ninfer-engine", daemon=True)  # daemonic: it ends with this process
        self._process.start()
        child.close()
        atexit.register(self._abandon)  # before multiprocessing's own exit hook, which hangs
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # the streams and the state
        # key -> (loop, stream, log-probability sinks, request id), while it runs
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, EventStream, tuple, str]] = {}
        self._keys: dict[str, int] = {}  # request id -> key, while it runs
        self._next_key = itertools.count()
        self._listeners: list[Callable[[str], None]] = []
        info = self._await_load()
        self.config = config
        self.model_id, self.max_context = info.model_id, info.max_context
        self.default_max_tokens, self.turn_anchors = info.default_max_tokens, info.turn_anchors
        self.sampling_defaults = info.sampling_defaults
        self.thinking_sampling_defaults = info.thinking_sampling_defaults
        self.tokenizer, self.chat_template = info.tokenizer, info.chat_template
        self.media_planner = info.media_planner  # media are decoded here, encoded there
        self._snapshot = info.snapshot
        self._state = EngineState.READY
        self._reader = threading.Thread(target=self._read, name="ninfer-engine-reader",
                                        daemon=True)

    def _await_load(self) -> EngineInfo:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._process.join()
                raise EngineLoadError(
                    f"the engine process exited while loading (status {self._process.exitcode})")
            if message[0] == "log":
                _log_record(message[1])
            elif message[0] == "error":
                self._process.join()
                raise EngineLoadError(message[1])
            else:
                return message[1]

    # -- ServingEngine ----------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._state

    def snapshot(self) -> EngineStats:
        return self._snapshot

    def add_failure_listener(self, listener: Callable[[str], None]) -> None:
        """Called once, on the reader thread, with the reason when the engine becomes FAILED."""
        self._listeners.append(listener)

    def start(self) -> None:
        if not self._reader.is_alive():
            self._reader.start()

    def submit(self, request: GenerationRequest) -> EventStream:
        """Send `request` to the engine process; its events arrive in the stream on this loop.
        Closing the stream early cancels the request there."""
        try:  # pickled here: a field that cannot travel fails this request, not the engine
            payload = pickle.dumps(request)
        except Exception as exc:
            return EventStream.of(TokenEvent(finish="error", error=EngineError(
                f"the request cannot be sent to the engine process: {exc}")))
        stream = EventStream()
        with self._lock:
            if self._state is not EngineState.READY:
                return EventStream.of(unavailable(f"the engine is {self._state.value}"))
            key = next(self._next_key)
            # the log-probability sinks the HTTP side reads: the child's entries land here
            self._streams[key] = (asyncio.get_running_loop(), stream,
                                  (request.logprob_sink, request.prompt_logprob_sink),
                                  request.request_id)
            self._keys[request.request_id] = key
        stream.on_close = lambda: self._send(("cancel", key))
        arrival = current_arrival()  # queue wait from arrival; the front end's requests behind
        self._send(("submit", key, payload, arrival.at, arrival.hand_over()))
        return stream

    def cancel(self, request_id: str) -> bool:
        """Cancel a running request (the operator's cancel key); False if none runs."""
        key = self._keys.get(request_id)
        if key is None:
            return False
        self._send(("cancel", key))
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine process; requests still queued or running end with a 503 error."""
        if self._process.is_alive():
            self._send(("stop", timeout))
            self._process.join(timeout + STOP_GRACE_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._reader.is_alive():
            self._reader.join(STOP_GRACE_S)
        with self._lock:
            if self._state is not EngineState.FAILED:
                self._state = EngineState.STOPPED
        self._fail_streams("the engine was stopped")
        atexit.unregister(self._abandon)

    def _abandon(self) -> None:
        """At interpreter exit without `stop` (an error, Ctrl-C during the load). The child
        ignores SIGTERM (the server's drain is the parent's), so multiprocessing's exit hook
        would terminate it in vain and then wait for it forever: closing the pipe stops a
        serving child, and a kill ends one still loading."""
        if self._process.is_alive():
            self._conn.close()
            self._process.join(STOP_GRACE_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    # -- the pipe ---------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError):  # the child is gone: the reader fails the engine
            pass

    def _read(self) -> None:
        """The reader thread: the child's messages until it stops or dies."""
        stopped, reason = False, None
        try:
            while not stopped:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    break
                stopped = self._take(message)
        except Exception as exc:  # a fault here must fail the engine, not leave it hanging
            log.exception("reading the engine process failed")
            reason = f"reading the engine process failed: {exc}"
            self._process.kill()
        if not stopped:
            self._process.join(STOP_GRACE_S)
            self._failed(reason or f"the engine process exited (status {self._process.exitcode})")
            self._fail_streams("the engine process exited")

    def _take(self, message: tuple) -> bool:
        """One message of the child; True once it has stopped."""
        kind = message[0]
        if kind == "step":
            if message[1] is not None:  # before the events: an ended request is retired
                self._snapshot = message[1]
            self._deliver(message[2])
        elif kind == "log":
            _log_record(message[1])
        elif kind == "failed":
            self._failed(message[1])
        return kind == "stopped"

    def _deliver(self, items: list[tuple[int, TokenEvent, tuple | None]]) -> None:
        pending: dict[asyncio.AbstractEventLoop, list[tuple[EventStream, TokenEvent]]] = {}
        with self._lock:
            for key, event, added in items:
                target = self._streams.get(key)
                if target is None:
                    continue
                loop, stream, sinks, request_id = target
                if event.finish is not None:
                    del self._streams[key]
                    self._keys.pop(request_id, None)
                for sink, entries in zip(sinks, added or ()):
                    if sink is not None:  # before the event: its reader reads them
                        sink.extend(entries)
                pending.setdefault(loop, []).append((stream, event))
        hand_over(pending)

    def _failed(self, reason: str) -> None:
        with self._lock:
            if self._state in (EngineState.FAILED, EngineState.STOPPED):
                return
            self._state = EngineState.FAILED
        log.error("engine failed: %s", reason)
        for listener in self._listeners:
            listener(reason)

    def _fail_streams(self, message: str) -> None:
        with self._lock:
            streams, self._streams, self._keys = self._streams, {}, {}
        event = unavailable(message)
        pending: dict[asyncio.AbstractEventLoop, list] = {}
        for loop, stream, _, _ in streams.values():
            pending.setdefault(loop, []).append((stream, event))
        hand_over(pending)


def _log_record(fields: dict) -> None:
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)
