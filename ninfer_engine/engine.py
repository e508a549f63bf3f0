"""`Engine`: loads an artifact and runs the step loop on one engine thread.

Each step reads `schedule -> run -> postprocess`: the scheduler admits and batches
(`step/scheduler.py`; `StepPrepare`, `step/prepare.py`, waits for a burst's other prompts first,
then grows the rows' leases, encodes media and drafts), the runner computes every row's logits
in one forward (`step/runner.py`), and `StepPostprocess` (`step/postprocess.py`) samples the
rows at once and streams each request's text back to the caller's event loop. A pure-decode
step may launch before the one before it is read (`StepLookahead`, `step/lookahead.py`), a
chained verify round likewise (`StepChainAhead`, `step/chain_ahead.py`). `engine_load` builds
the parts; `snapshot()` returns the latest `EngineStats`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any, Callable

import torch

from .arrival import current_arrival
from .config import EngineConfig
from .engine_load import EngineLoadError, engine_runner, load_engine
from .faults import Faults
from .kernels import compile_watch
from .parallel import SINGLE, RankGroup
from .parallel.lockstep import Leader
from .serving import prefill_chunk_for
from .stats import EngineStats
from .step.admission import check_admissible
from .step.chain_ahead import ChainAhead, ChainFlight, StepChainAhead
from .step.event_pump import EventPump, EventStream
from .step.lookahead import InFlight, Lookahead, StepLookahead
from .step.postprocess import StepPostprocess
from .step.prepare import StepPrepare
from .step.sampling import Sampler, pick_rows, prefetch_masks
from .step.sampling_presets import default_max_tokens, sampling_defaults
from .step.scheduler import Batch, Scheduler
from .step.sequence import Sequence
from .step.stats_builder import StatsBuilder
from .step.step_failure import UNAVAILABLE, StepFailure
from .step.warm_up import warm_up
from .tokenizer import IncrementalDetokenizer
from .types import EngineError, EngineState, GenerationRequest, TokenEvent
from .vision.tower import VisionTower

__all__ = ["Engine", "EngineLoadError"]

log = logging.getLogger("ninfer.engine")

IDLE_PUBLISH_S = 0.25
# snapshots while busy: observers read them at a few Hz, and building one is ~0.1-0.3 ms of the
# engine thread's time, which a step of ~2 ms would otherwise pay every step (a request's end
# publishes at once)
BUSY_PUBLISH_S = 0.05


class Engine(StepPrepare, StepPostprocess, StepLookahead, StepChainAhead, StepFailure):
    """The `ServingEngine` (client.py) backed by our torch model."""

    def __init__(self, config: EngineConfig, artifact: Any = None,
                 on_failure: Callable[[str], None] | None = None, model: Any = None,
                 ranks: RankGroup = SINGLE, vision: VisionTower | None = None,
                 events: Any = None) -> None:
        """`artifact`: an opened artifact (default: open `config.artifact`); `model`: its text
        model already resident (`ninfer bench` draws random weights on the device), else the
        model is built from the artifact's weights; `ranks`: tensor parallelism, this engine
        rank 0 of the group (its followers run `parallel.follower.Follower`); `vision`: its
        vision tower already resident (bench/vision_encoder.py), else loaded from the artifact
        under `--vision`; `events`: where a step's events go (`flush()` after every step),
        an `EventPump` by default (`engine_process` passes its pipe)."""
        self.config = config
        self._failure_listeners: list[Callable[[str], None]] = [on_failure] if on_failure else []
        self._state = EngineState.LOADING
        self._failure: str | None = None
        loaded = load_engine(config, artifact, model, ranks, vision)
        self.tokenizer, self.chat_template = loaded.tokenizer, loaded.chat_template
        self.model, self.memory, self.speculator, self.vision = (
            loaded.model, loaded.memory, loaded.speculator, loaded.vision)
        self.config = config = loaded.config  # the resolved `--kv-capacity`
        graphs, text_config, artifact = loaded.graphs, loaded.text_config, loaded.artifact
        device = loaded.device
        arch = (text_config.get("architectures") or [text_config.get("model_type", "model")])[0]
        self.model_id = config.model_id or artifact.name or arch
        self.max_context = config.max_context
        self.turn_anchors = config.turn_anchors
        self.default_max_tokens = default_max_tokens(artifact, config)
        self.sampling_defaults = sampling_defaults(artifact, config, thinking=False)
        self.thinking_sampling_defaults = sampling_defaults(artifact, config, thinking=True)
        self._eos = frozenset(self.tokenizer.eos_token_ids)
        self.runner = engine_runner(loaded, ranks, self._eos,
                                    (self.sampling_defaults, self.thinking_sampling_defaults))
        self.scheduler = Scheduler(config.max_concurrency, prefill_chunk_for(config, device),
                                   config.pending_timeout_ms / 1000, self._admit,
                                   self.memory.chunk_tokens)
        self.stats = StatsBuilder(self.model_id, config, self.model, self.memory)
        # under `--spec`, the plain steps the policy chooses (`Speculator.plain_next`)
        self._lookahead = Lookahead(self.runner, self.max_context,
                                    config.lookahead if config.lookahead is not None
                                    else graphs is not None and graphs.capture)
        self._in_flight: InFlight | None = None  # a lookahead step the host has not read
        self._settled = 0.0  # perf_counter when the last step settled (`StepPostprocess`)
        # `--spec mtp`: a chained verify round whose next may launch before it is read
        self._chain_ahead = ChainAhead(self.runner, self.speculator, self.memory,
                                       self.max_context, config.chain_ahead)
        self._chain_flight: ChainFlight | None = None
        # the CPU step verifies as many rows as it holds: drafts past them would send the
        # step to the eager forward, several times its cost
        self._draft_cap = graphs.draft_cap if graphs is not None else lambda batch: None
        self._faults = Faults("")
        # a step's token events, handed to the loops (or the pipe) once a step
        self._events = events if events is not None else EventPump()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = 0
        self._carried: Batch | None = None  # the step under way's rows (`StepFailure`)
        self._step_failed = False  # the last busy step raised and ended its rows
        self._retired, self._published = False, 0.0  # `step` publishes by these
        self._preparing = 0  # the front end's requests behind the last hand-over (`add`)
        if device.type == "cuda":  # the eager prompt steps' kernels compile now, not in traffic
            # within the pages free now: an elastic pool does not grow for it
            warm_up(self, prefill_chunk_for(config, device), min(
                config.max_context, self.memory.allocator.free * self.memory.storage.page_tokens))
            self.memory.forget_prefixes()  # its prompts are no one's prefixes
            if self.speculator is not None:
                self.speculator.reset()
            self.stats = StatsBuilder(self.model_id, config, self.model, self.memory)
            self._step = 0
            compile_watch.watch()  # from now on a Triton compile is a stall: logged
        self._faults = Faults(os.environ.get("NINFER_FAULT", ""))  # not in the warm-up
        self._state = EngineState.READY
        self._snapshot = self.stats.build(self._state.value, None, self.scheduler,
                                          self.speculator and self.speculator.stats(),
                                          self.vision and self.vision.stats())

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def media_planner(self):
        """`ServingEngine.media_planner`: the tower's, under `--vision`."""
        return self.vision.planner if self.vision is not None else None

    def snapshot(self) -> EngineStats:
        return self._snapshot

    def start(self) -> None:
        """Start the engine thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still queued or running end with a 503 error."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._state is not EngineState.FAILED:
            self.runner.close()
            self._state = EngineState.STOPPED
            self._fail_all("the engine was stopped")
            self._events.flush()
            self._publish()

    def submit(self, request: GenerationRequest) -> EventStream:
        """Queue a request; its events arrive in the returned stream on this event loop.
        Closing the stream early cancels the request."""
        unavailable = TokenEvent(finish="error", error=EngineError(
            f"the engine is {self._state.value}", UNAVAILABLE, 503))
        if self._state is not EngineState.READY or self._thread is None:
            return EventStream.of(unavailable)
        stream = EventStream()
        # queue wait and TTFT count from the HTTP arrival
        arrival = current_arrival()
        seq = self.add(request, self._events.emitter(asyncio.get_running_loop(), stream),
                       arrival.at, arrival.hand_over())
        if seq is None:
            return EventStream.of(unavailable)
        stream.on_close = lambda: self.cancel_sequence(seq)
        return stream

    def cancel_sequence(self, seq: Sequence) -> None:
        """End `seq` at the next step (its reader is gone)."""
        seq.cancelled = True
        self._wake.set()

    def add(self, request: GenerationRequest, emit: Callable[[TokenEvent], None],
            arrived: float | None = None, preparing: int = 0) -> Sequence | None:
        """Queue `request` for the next step; its events go to `emit` (on the engine thread).
        `preparing`: requests the front end was still preparing as it handed this one over
        (`arrival.Preparing`: a prompt step may wait for them, `Scheduler.arrival_wait`).
        None: the scheduler takes no more requests (the engine is stopping)."""
        seq = Sequence(
            request, emit, Sampler.for_request(request),
            IncrementalDetokenizer(self.tokenizer, request.prompt_ids),
            frozenset() if request.ignore_eos else self._eos,
            arrived=time.monotonic() if arrived is None else arrived, handed=time.monotonic(),
            spec_detail=self.config.log_speculation_detail)
        self._preparing = preparing
        if not self.scheduler.add(seq):
            return None
        self._wake.set()
        return seq

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request at the next step (the operator's cancel key)."""
        for seq in [*self.scheduler.queued(), *list(self.scheduler.running)]:
            if seq.id == request_id and seq.finish_reason is None:
                seq.cancelled = True
                self._wake.set()
                return True
        return False

    def _admit(self, seq: Sequence) -> bool:
        """Request-level checks at admission, then a KV lease; False: wait for pages."""
        check_admissible(seq, self.max_context, self.memory.budget_tokens,
                         self.model.vocab_size, isinstance(self.runner, Leader))
        return self.memory.admit(seq)

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stopping.is_set():
                    self._wake.clear()  # before scheduling, so a submit during the step is seen
                    if not self.step():
                        self._wake.wait(IDLE_PUBLISH_S)
                        self.runner.idle()
                        self._publish()
        except BaseException as exc:
            self._fail_engine(exc)
            self._events.flush()

    def step(self) -> bool:
        """One turn of the engine loop: a step, its events handed over, the stats published.
        The engine thread runs it; `ninfer bench` times it. False: there was nothing to do."""
        self._carried = None
        try:
            busy = self._step_once()
            self._step_failed = self._step_failed and not busy
        except Exception as exc:  # its rows end, or the engine does (`step_failure`)
            self._end_carried(exc, lockstep=isinstance(self.runner, Leader))
            busy = True
        if busy and (self._retired or time.monotonic() - self._published >= BUSY_PUBLISH_S):
            self._publish()  # before the events: a reader of a request's end sees it retired
        self._events.flush()
        return busy

    def _step_once(self) -> bool:
        """One step: schedule -> forward -> sample -> update. False when there was nothing to do."""
        if self._in_flight is not None:
            return self._continue()
        if self._chain_flight is not None:
            return self._continue_chain()
        admit = self._gather()
        started = time.perf_counter()
        now = time.monotonic()
        batch, ended = self.scheduler.schedule(now, admit)
        self._carried = batch
        for seq in ended:
            self._retire(seq)
        batch = self._encode_media(self._draft(self._reserve(batch)))
        if batch.empty:  # held back while rows decoded, and they ended: schedule again now
            return bool(ended) or not admit
        self._faults.check_step(self._step)
        self._step += 1
        # a new request's first grammar mask fills during its prompt's forward, as the others'
        # did during the last step's (the prefetch passes over rows already under way)
        prefetch_masks([s.sampler for s in batch.sampled], self.model.device)
        logits = self.runner.forward(batch)
        if self._lookahead.holds(batch):  # its picks feed the next step before they are read
            self._in_flight = InFlight(batch, pick_rows(logits, [s.sampler for s in batch.decode]),
                                       started)
            return True
        if self._chain_ahead.holds(batch):  # its next round may launch before it is read
            self._chain_flight = ChainFlight(batch, logits, started)
            return True
        self._finish(batch, logits, started)
        return True

    def _retire(self, seq: Sequence) -> None:
        self._retired = True
        if self.speculator is not None:
            self.speculator.forget(seq)
        self.runner.forget(seq)
        if seq.finish_reason in ("stop", "length") and seq.state_exact:
            self.memory.checkpoint(seq)  # the conversation frontier, for the next turn
        self.memory.release(seq)
        self.scheduler.remove(seq)
        self.stats.record_finished(seq)

    def _publish(self) -> None:
        self._retired, self._published = False, time.monotonic()
        self._snapshot = self.stats.build(self._state.value, self._failure, self.scheduler,
                                          self.speculator and self.speculator.stats(),
                                          self.vision and self.vision.stats())
