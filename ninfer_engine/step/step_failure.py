"""A step that raises: the requests it carried fail, and the engine goes on where it safely can;
else the engine's own failure (`_fail_engine`: every request ends with a 503, FAILED).

Per-request failures are caught where they happen (a grammar, a sampler, acceptance, a
detokenizer: `postprocess`, `prepare`). Anything else a step raises — its forward, a draft, a
media encode, a kernel — leaves the rows it carried in an unknown state: K/V written past their
`cached`, recurrent slots advanced, drafts staged. A step writes no other request's state (a
row writes its own pages past its shared prefix, which the tree never holds, and its own state
slot), and a failed row's pages and slot go back to the pools (a slot is zeroed when next
acquired), so ending those rows with an error leaves the engine whole. (vLLM and SGLang end
the engine with any step that raises.)

The engine fails instead (`Engine._fail_engine`; ninfer-serve exits 2 for its supervisor) where
the fault cannot be pinned on the rows (`engine_wide`):
- a device error (`torch.AcceleratorError`, or a Triton or library error naming CUDA: after
  an illegal address or a failed launch the CUDA context is unusable);
- tensor parallelism: the followers run each step in lockstep with the leader's collectives;
- an injected engine fault (`faults.EngineFault`);
- a step that carried no rows (it failed while scheduling);
- the step before failed too: a fault that outlives the rows it carried is the engine's.

`StepFailure` is that part of `Engine` (as `StepPostprocess` is another): it reads the engine's
`_carried`, `_step_failed`, `scheduler`, `runner`, `_in_flight`, `_chain_flight` and
`_events`, counts in its `stats`, sets its `_state` and `_failure`, tells its
`_failure_listeners`, and hands the rows to `_retire`. `/metrics` counts the steps it contained
(`ninfer:steps_failed_total`).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from ..faults import EngineFault
from ..types import EngineError, EngineState
from .scheduler import Batch
from .sequence import Sequence

log = logging.getLogger("ninfer.engine")

UNAVAILABLE = "service_unavailable"
# a CUDA error torch did not raise as `torch.AcceleratorError` (a Triton launch's, a library's);
# "CUDA out of memory" is none of these: the pool is intact, only the step's rows end
DEVICE_MESSAGES = ("CUDA error", "Triton Error [CUDA]", "CUBLAS_STATUS_", "CUDNN_STATUS_")


def carried_rows(batch: Batch | None, running: list[Sequence]) -> list[Sequence]:
    """The step's rows still running (one its postprocess retired before the failure is not)."""
    if batch is None:
        return []
    ids = {id(seq) for seq in running}
    return [seq for seq in (*batch.decode, *(c.seq for c in batch.chunks)) if id(seq) in ids]


def engine_wide(exc: Exception, rows: list[Sequence], failed_before: bool,
                lockstep: bool) -> str | None:
    """Why `exc` must fail the whole engine (see the module docstring), or None: only `rows`."""
    if isinstance(exc, torch.AcceleratorError) or any(m in str(exc) for m in DEVICE_MESSAGES):
        return "a device error"
    if isinstance(exc, EngineFault):
        return "an engine fault"
    if lockstep:
        return "tensor-parallel ranks step in lockstep"
    if not rows:
        return "the step carried no rows"
    if failed_before:
        return "the step before failed too"
    return None


class StepFailure:
    """The failure methods of `Engine` (see the module docstring)."""

    def _end_carried(self, exc: Exception, lockstep: bool) -> None:
        """The step that raised `exc` ends the requests it carried, or re-raises `exc` where
        the failure is the engine's."""
        rows = carried_rows(self._carried, self.scheduler.running)
        why = engine_wide(exc, rows, self._step_failed, lockstep)
        if why is not None:
            log.error("a step failed and the engine with it: %s", why)
            raise exc
        log.exception("a step failed: its %d request(s) end with an error, the engine goes on",
                      len(rows), exc_info=exc)
        self._step_failed = True
        self.stats.record_step_failed()
        self._in_flight = self._chain_flight = None
        chain = getattr(self.runner, "chain", None)
        if chain is not None:
            chain.drop()  # its rounds were of these rows
        error = EngineError(f"the step that carried this request failed: "
                            f"{type(exc).__name__}: {exc}")
        for seq in rows:
            if seq.finish_reason is None:
                seq.fail(error)
            self._retire(seq)

    def add_failure_listener(self, listener: Callable[[str], None]) -> None:
        """Called once, on the engine thread, with the reason when the engine becomes FAILED."""
        self._failure_listeners.append(listener)

    def rank_failed(self, reason: str) -> None:
        """Another tensor-parallel rank is gone (`parallel.launch` watches the processes):
        FAILED now, not when a collective notices (NCCL waits out its timeout)."""
        if self._state is EngineState.READY:
            self._fail_engine(RuntimeError(reason))
            self._events.flush()

    def _fail_engine(self, exc: BaseException) -> None:
        log.exception("engine loop failed", exc_info=exc)
        self._failure = f"{type(exc).__name__}: {exc}"
        self._state = EngineState.FAILED
        self._fail_all(f"the engine failed: {self._failure}")
        self._publish()
        for listener in self._failure_listeners:
            listener(self._failure)

    def _fail_all(self, message: str) -> None:
        """Every queued and running request ends with a 503 (engine failure or shutdown)."""
        for seq in self.scheduler.drain():
            if seq.finish_reason is None:
                seq.fail(EngineError(message, UNAVAILABLE, 503))
            self._retire(seq)
