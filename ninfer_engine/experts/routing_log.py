"""`RoutingLog`: the routed ids of a captured decode step's in-place MoE layers, for the host.

The host works while the GPU runs the next step: the step clears its routing log and the
routers write it; after the launch `record` queues its copy to page-locked memory (a ring of
them); `take` reads the copies of the steps that are done before the next launch (without
waiting for one in flight: the engine's lookahead step stays queued behind it) and `settle`
hands them to the tiers (`InPlaceReads.settle`) after that launch, so the bookkeeping overlaps
the step.
"""
from __future__ import annotations

import time
from collections import deque

import torch

RING = 3  # page-locked copies of a step's routing log: the lookahead keeps one step ahead


class RoutingLog:
    """The routed ids of a decode step's in-place MoE layers (see the module docstring)."""

    def __init__(self, layers: list[dict], rows: int, device) -> None:
        tiered = [lay for lay in layers if getattr(lay.get("tier"), "in_place", None)]
        self.tiers = [lay["tier"] for lay in tiered]
        self.row = {id(t): i for i, t in enumerate(self.tiers)}
        # + 1: the shared expert's column, where it is the slot after the routed ones
        k = max((lay["moe"].top_k + 1 for lay in tiered), default=0)
        self.ids = None
        self._free: list[torch.Tensor] = []  # page-locked copies of the log, unused
        self._landing: deque = deque()  # (event or None, copy): launched steps' logs
        self.taken: list[list[list[int]]] = []  # steps' routing read, not yet settled
        self.seconds = 0.0  # host time in `settle` (overlapping the step; the bench shows it)
        if tiered:
            device = torch.device(device)
            self.ids = torch.full((len(tiered), rows * k), -1, dtype=torch.long, device=device)
            self._free = [torch.full_like(self.ids, -1, device="cpu").pin_memory()
                          if device.type == "cuda" else torch.full_like(self.ids, -1)
                          for _ in range(RING)]

    def out(self, tier, rows: int, k: int) -> torch.Tensor | None:
        """Where the step's router writes `tier`'s ids `[rows, k]`; None for other layers."""
        if tier is None or id(tier) not in self.row:
            return None
        return self.ids[self.row[id(tier)], : rows * k].view(rows, k)

    def clear(self) -> None:
        """The step's first node: rows it does not run stay -1."""
        if self.ids is not None:
            self.ids.fill_(-1)

    def record(self) -> None:
        """After a launch: the step's log copied behind it into a page-locked buffer (a ring
        of them: with a step in flight, the host reads the one before's without waiting)."""
        if self.ids is None:
            return
        if not self._free:
            self._take(wait=True, most=1)
        host = self._free.pop()
        host.copy_(self.ids, non_blocking=True)
        event = None
        if self.ids.is_cuda:
            event = torch.cuda.Event()
            event.record()
        self._landing.append((event, host))

    def take(self, wait: bool = False) -> None:
        """Before a launch: the routing of the launched steps that are done (every one with
        `wait`; the GPU is not waited for otherwise, so a step in flight keeps the next one
        queued behind it), the tables brought up to date where an eager path changed a slot
        map."""
        if self.ids is None:
            return
        self._take(wait)
        for tier in self.tiers:
            tier.in_place.prepare()
        self._push()

    def _take(self, wait: bool, most: int | None = None) -> None:
        while self._landing and most != 0:
            event, host = self._landing[0]
            if event is not None and not wait and not event.query():
                return
            if event is not None:
                event.synchronize()
            self._landing.popleft()
            self.taken.append(host.tolist())
            self._free.append(host)
            most = None if most is None else most - 1

    def settle(self) -> None:
        """After a launch: the routing taken, counted and admitted (see the module docstring);
        with none taken, the copies that have landed are mapped in."""
        start = time.perf_counter()
        for log in self.taken or [[[]] * len(self.tiers)]:
            for tier, row in zip(self.tiers, log):
                # -1: rows the step did not run; `experts`: the shared expert's slot
                tier.in_place.settle([e for e in row if 0 <= e < tier.experts])
        self.taken.clear()
        self._push()
        self.seconds += time.perf_counter() - start

    def _push(self) -> None:
        if self.tiers:
            self.tiers[0].in_place.tables.push()
