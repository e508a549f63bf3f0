"""The engine process's side of `engine_process`: load the `Engine`, report it, then serve the
parent's messages (submit, cancel, stop) until told to stop or the pipe closes.

Everything leaves through one pipe under one lock: a step's events and the changed snapshot in
one message (`PipePump`, the engine's event sink), log records (`_PipeHandler`), a failure.
"""
from __future__ import annotations

import logging
import pickle
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .config import EngineConfig
from .engine_load import EngineLoadError
from .stats import EngineStats
from .types import EngineError, SamplingParams, TokenEvent

UNAVAILABLE = "engine_unavailable"
IDLE_PUBLISH_S = 0.25  # a changed snapshot leaves this often while no step runs


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
    media_planner: Any  # `vision.tower.MediaPlanner` under `--vision`
    snapshot: EngineStats


def unavailable(message: str) -> TokenEvent:
    """The finishing event of a request the engine cannot take (stopped, failed, gone)."""
    return TokenEvent(finish="error", error=EngineError(message, UNAVAILABLE, 503))


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
        self._items: list[tuple[int, TokenEvent, Any]] = []
        self.snapshot: Callable[[], EngineStats] | None = None  # set once the engine exists
        self._sent: EngineStats | None = None

    def emitter(self, key: int, request: Any = None) -> Callable[[TokenEvent], None]:
        """`key`'s emit function. A request with log-probability sinks (lists the engine
        appends to, read by the HTTP side) sends each event with the entries added since the
        last one, which the parent appends to its own lists before it hands the event over."""
        sinks = [getattr(request, name, None) for name in ("logprob_sink", "prompt_logprob_sink")]
        sent = [0, 0]

        def emit(event: TokenEvent) -> None:
            added = None
            if sinks[0] is not None or sinks[1] is not None:
                added = tuple(() if sink is None else sink[sent[i]:]
                              for i, sink in enumerate(sinks))
                sent[:] = [0 if sink is None else len(sink) for sink in sinks]
            with self._pipe.lock:
                self._items.append((key, event, added))
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


def child_main(config: EngineConfig, conn, log_level: int) -> None:
    """The engine process: load, report, then serve the parent's messages until `stop`."""
    # Ctrl-C reaches the terminal's whole process group and systemd's stop the whole unit:
    # the parent drains and then stops this process; a parent that dies closes the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = _Pipe(conn)
    root = logging.getLogger()
    root.handlers[:] = [_PipeHandler(pipe)]
    root.setLevel(log_level)
    from .constrained.matcher import use_engine_tokenizer
    from .engine import Engine  # torch and CUDA start here, not in the parent

    pump = PipePump(pipe)
    try:
        engine = Engine(config, events=pump)
    except BaseException as exc:  # the parent raises it as the load error
        pipe.send(("error", str(exc) if isinstance(exc, EngineLoadError)
                   else f"cannot load the engine: {exc}"))
        return
    pump.snapshot = engine.snapshot
    use_engine_tokenizer(engine.tokenizer)  # received grammars compile over it
    engine.add_failure_listener(lambda reason: pipe.send(("failed", reason)))
    pipe.send(("ready", EngineInfo(
        engine.model_id, engine.max_context, engine.default_max_tokens, engine.turn_anchors,
        engine.sampling_defaults, engine.thinking_sampling_defaults, engine.tokenizer,
        engine.chat_template, engine.media_planner, engine.snapshot())))
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
            key, payload, arrived, preparing = message[1:]
            try:  # a request that cannot be rebuilt here fails alone
                request = pickle.loads(payload)
            except Exception as exc:
                pump.emitter(key)(TokenEvent(finish="error", error=EngineError(
                    f"the engine process could not take the request: {exc}")))
                pump.flush()
                continue
            emit = pump.emitter(key, request)
            seq = engine.add(request, emit, arrived, preparing)
            if seq is None:
                emit(unavailable(f"the engine is {engine.state.value}"))
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
