"""Next-step grammar masks filled on a background thread while the step's forward runs.

The mask of a row's next token depends only on the tokens the row already has. So once step n's
tokens are recorded, `start(constraints)` hands every active constraint to one worker thread,
which fills their bits with llguidance's executor (it releases the GIL and spreads the rows over
its own threads) into a fresh host buffer, page-locked when the logits live on a CUDA device so
their copy there does not block. Meanwhile the engine schedules, loads and launches step n + 1;
at its sampling `bitmasks(constraints)` waits for the fill and takes each row that is still
current, filling any other row itself (`mask.fill`).

A prefetched row is used only for the state it was filled at: it carries the constraint's
`version` (the count of tokens it recorded), and a constraint advanced since (a forced token,
a newly active grammar, several tokens of a verify row) is filled again, synchronously. A
request's first mask is started by the engine when its prompt's step is launched (before the
forward); a row no fill started for is filled synchronously too. While a fill reads a
matcher, every other use of it waits (`TokenConstraint.settle`).

`COUNTERS` says how the rows were served and how long the engine thread waited
(`bench/mask_cost.py` reads it); `NINFER_MASK_PREFETCH=0` turns prefetching off (`ENABLED`),
for comparison.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from . import mask
from .matcher import TokenConstraint

log = logging.getLogger("ninfer.constrained")

ENABLED = os.environ.get("NINFER_MASK_PREFETCH", "1") != "0"


@dataclass
class Counters:
    """Process-wide totals since the last `reset` (engine thread side)."""

    fills: int = 0  # background fills started
    prefetched_rows: int = 0  # rows whose mask a background fill made, still current
    sync_rows: int = 0  # rows filled on the engine thread (not prefetched, or stale)
    wait_s: float = 0.0  # engine-thread time spent waiting for background fills
    sync_s: float = 0.0  # engine-thread time spent filling rows itself

    def reset(self) -> None:
        self.__init__()


COUNTERS = Counters()


class _Fill:
    """One background fill: its buffer [n, W] and the future that completes it."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.future: Future | None = None


_WORKER: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _WORKER
    with _LOCK:
        if _WORKER is None:
            # one thread: it only waits on llguidance, whose executor brings its own threads
            _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninfer-masks")
        return _WORKER


def _run(pairs: list, buffer: torch.Tensor) -> None:
    try:
        mask.fill(pairs, buffer)
    except Exception:
        log.exception("background grammar mask fill failed; filling at sampling instead")
        raise


def _current(constraint: TokenConstraint) -> bool:
    """A fill of the constraint's present state is done or under way."""
    held = constraint.prefetched
    return held is not None and held[2] == constraint.version


def start(constraints: list[TokenConstraint], pin: bool = False) -> None:
    """Start filling the next masks of `constraints` (the step's constrained rows that go on)
    on the worker thread; `pin`: into page-locked memory (the logits are on a CUDA device).
    Errored and inactive constraints are left to the synchronous path, which reports them."""
    if not ENABLED:
        return
    rows = [c for c in constraints
            if c.active and not _current(c) and not c.matcher.is_error()]
    if not rows:
        return
    rows = [c for c in rows if c.vocab == rows[0].vocab]  # one buffer: one row width
    pairs = [(c._matcher, i) for i, c in enumerate(rows)]  # built here: the worker needs no GIL
    try:
        fill = _Fill(mask.new_buffer(len(rows), rows[0].vocab, pin, zeroed=False))
        fill.future = _worker().submit(_run, pairs, fill.buffer)
    except Exception:  # no page-locked memory, a worker shut down: sampling fills them itself
        log.exception("cannot start a background grammar mask fill")
        return
    for i, c in enumerate(rows):
        c.inflight = fill.future
        c.prefetched = (fill, i, c.version)
    COUNTERS.fills += 1


def _take(constraint: TokenConstraint) -> tuple[torch.Tensor, int] | None:
    """(buffer, row) of the constraint's prefetched mask if it is of the present state (waits
    for its fill); None: fill it now. A prefetched mask is taken once."""
    held, constraint.prefetched = constraint.prefetched, None
    if held is None:
        return None
    fill, row, version = held
    constraint.settle()
    if version != constraint.version or fill.future.exception() is not None:
        return None
    return fill.buffer, row


def bitmasks(constraints: list[TokenConstraint], pin: bool = False) -> torch.Tensor:
    """The allowed-token bits of each constraint's next token, int32 [n, ceil(vocab / 32)]
    (as `mask.bitmasks`): prefetched rows where current, the others filled now. Raises, as
    `mask.bitmasks`, when a constraint's output already left its grammar."""
    started = time.perf_counter()
    taken = [_take(c) for c in constraints]
    waited = time.perf_counter()
    COUNTERS.wait_s += waited - started
    for constraint in constraints:
        constraint.check()
    first = taken[0]
    if (first is not None and first[0].shape[0] == len(constraints)
            and all(t is not None and t[0] is first[0] and t[1] == i
                    for i, t in enumerate(taken))):
        COUNTERS.prefetched_rows += len(constraints)
        return first[0]  # the usual case: the very rows of one fill, in its order
    bits = mask.new_buffer(len(constraints), constraints[0].vocab, pin, zeroed=False)
    missing = []
    for i, t in enumerate(taken):
        if t is None:
            missing.append((constraints[i]._matcher, i))
        else:
            bits[i] = t[0][t[1]]
    if missing:
        mask.fill(missing, bits)
    COUNTERS.prefetched_rows += len(constraints) - len(missing)
    COUNTERS.sync_rows += len(missing)
    COUNTERS.sync_s += time.perf_counter() - waited
    return bits
