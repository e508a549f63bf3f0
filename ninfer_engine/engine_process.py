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
import itertools
import logging
import multiprocessing as mp
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .arrival import current_arrival
from .config import EngineConfig
from .engine_load import EngineLoadError
from .stats import EngineStats
from .step.event_pump import EventStream, hand_over
from .types import EngineError, EngineState, GenerationRequest, SamplingParams, TokenEvent

UNAVAILABLE = "engine_unavailable"
IDLE_PUBLISH_S = 0.25  # the child sends a changed snapshot this often while no step runs
STOP_GRACE_S = 5.0  # past `stop`'s timeout, before the child is killed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineInfo:
    """What the parent serves from without asking the child: sent once, after the load."""

    model_id: str
    max_context: int
    default_max_tokens: int
    turn_anchors: int
    sampling_defaults: SamplingParams
    thinking_sampling_defaults: SamplingParams
    tokenizer: Any
    chat_template: Any
    snapshot: EngineStats


def _unavailable(message: str) -> TokenEvent:
    return TokenEvent(finish="error", error=EngineError(message, UNAVAILABLE, 503))


class EngineProcess:
    """Starts the engine process and waits for its load (an `EngineLoadError` if it fails)."""

    vision = None  # media are prepared in the parent: `--vision` keeps the engine in-process

    def __init__(self, config: EngineConfig) -> None:
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_child_main, args=(config, child, logging.getLogger().getEffectiveLevel()),
            name="ninfer-engine", daemon=True)  # daemonic: it ends with this process
        self._process.start()
        child.close()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # the streams and the state
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, EventStream]] = {}
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
        stream = EventStream()
        with self._lock:
            if self._state is not EngineState.READY:
                return EventStream.of(_unavailable(f"the engine is {self._state.value}"))
            key = next(self._next_key)
            self._streams[key] = (asyncio.get_running_loop(), stream)
            self._keys[request.request_id] = key
        stream.on_close = lambda: self._send(("cancel", key))
        self._send(("submit", key, request, current_arrival().at))  # queue wait from arrival
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

    # -- the pipe ---------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError):  # the child is gone: the reader fails the engine
            pass

    def _read(self) -> None:
        """The reader thread: the child's messages until it stops or dies."""
        stopped = False
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "step":
                if message[1] is not None:  # before the events: an ended request is retired
                    self._snapshot = message[1]
                self._deliver(message[2])
            elif kind == "log":
                _log_record(message[1])
            elif kind == "failed":
                self._failed(message[1])
            elif kind == "stopped":
                stopped = True
                break
        if not stopped:
            self._process.join(STOP_GRACE_S)
            self._failed(f"the engine process exited (status {self._process.exitcode})")
            self._fail_streams("the engine process exited")

    def _deliver(self, items: list[tuple[int, TokenEvent]]) -> None:
        pending: dict[asyncio.AbstractEventLoop, list[tuple[EventStream, TokenEvent]]] = {}
        with self._lock:
            for key, event in items:
                target = self._streams.get(key)
                if target is None:
                    continue
                if event.finish is not None:
                    del self._streams[key]
                pending.setdefault(target[0], []).append((target[1], event))
            if any(event.finish is not None for _, event in items):
                live = set(self._streams)
                self._keys = {rid: key for rid, key in self._keys.items() if key in live}
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
        event = _unavailable(message)
        pending: dict[asyncio.AbstractEventLoop, list] = {}
        for loop, stream in streams.values():
            pending.setdefault(loop, []).append((stream, event))
        hand_over(pending)


def _log_record(fields: dict) -> None:
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


# -- the engine process ---------------------------------------------------------------------
class _Pipe:
    """The child's end: one lock, so a step's message and a log record never interleave."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, message: tuple) -> None:
        with self.lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the parent is gone
                pass


class _PipeHandler(logging.Handler):
    """The child's log records, formatted here (their arguments may not pickle), to the parent."""

    def __init__(self, pipe: _Pipe) -> None:
        super().__init__()
        self._pipe = pipe

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(record.__dict__, msg=record.getMessage(), args=None, exc_info=None)
        if record.exc_info:
            fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
        self._pipe.send(("log", fields))


class PipePump:
    """The engine's event sink in the child (`Engine(events=...)`): what a step emitted, and
    the snapshot when the engine published a new one, leave in one message at `flush`."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._items: list[tuple[int, TokenEvent]] = []
        self.snapshot: Callable[[], EngineStats] | None = None  # set once the engine exists
        self._sent: EngineStats | None = None

    def emitter(self, key: int) -> Callable[[TokenEvent], None]:
        def emit(event: TokenEvent) -> None:
            with self._pipe.lock:
                self._items.append((key, event))
        return emit

    def flush(self) -> None:
        with self._pipe.lock:  # taken and sent under one lock: events leave in order
            items, self._items = self._items, []
            snapshot = self.snapshot() if self.snapshot is not None else None
            if snapshot is self._sent:
                snapshot = None
            else:
                self._sent = snapshot
            if items or snapshot is not None:
                try:
                    self._pipe.conn.send(("step", snapshot, items))
                except (OSError, ValueError):
                    pass


def _child_main(config: EngineConfig, conn, log_level: int) -> None:
    """The engine process: load, report, then serve the parent's messages until `stop`."""
    # Ctrl-C reaches the terminal's whole process group and systemd's stop the whole unit:
    # the parent drains and then stops this process; a parent that dies closes the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = _Pipe(conn)
    root = logging.getLogger()
    root.handlers[:] = [_PipeHandler(pipe)]
    root.setLevel(log_level)
    from .engine import Engine  # torch and CUDA start here, not in the parent

    pump = PipePump(pipe)
    try:
        engine = Engine(config, events=pump)
    except BaseException as exc:  # the parent raises it as the load error
        pipe.send(("error", str(exc) if isinstance(exc, EngineLoadError)
                   else f"cannot load the engine: {exc}"))
        return
    pump.snapshot = engine.snapshot
    engine.add_failure_listener(lambda reason: pipe.send(("failed", reason)))
    pipe.send(("ready", EngineInfo(
        engine.model_id, engine.max_context, engine.default_max_tokens, engine.turn_anchors,
        engine.sampling_defaults, engine.thinking_sampling_defaults, engine.tokenizer,
        engine.chat_template, engine.snapshot())))
    engine.start()
    _serve(engine, pump, pipe)


def _serve(engine, pump: PipePump, pipe: _Pipe) -> None:
    conn = pipe.conn
    sequences: dict[int, Any] = {}
    while True:
        try:
            if not conn.poll(IDLE_PUBLISH_S):
                pump.flush()  # an idle engine's snapshots (the loop publishes, no step flushes)
                continue
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            engine.stop()
            return
        kind = message[0]
        if kind == "submit":
            key, request, arrived = message[1:]
            emit = pump.emitter(key)
            seq = engine.add(request, emit, arrived)
            if seq is None:
                emit(_unavailable(f"the engine is {engine.state.value}"))
                pump.flush()
            else:
                sequences[key] = seq
        elif kind == "cancel":
            seq = sequences.pop(message[1], None)
            if seq is not None and seq.finish_reason is None:
                engine.cancel_sequence(seq)
        elif kind == "stop":
            engine.stop(message[1])
            pump.flush()
            pipe.send(("stopped",))
            return
        for key in [k for k, s in sequences.items() if s.finish_reason is not None]:
            del sequences[key]
