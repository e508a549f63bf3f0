"""The captured decode step's path for offloaded experts: no host sync inside the step.

`InPlaceReads` (one per `LayerTier` whose misses are `read`: `--expert-miss read`, and `auto`
where the stacks are bf16 or fp8-row) owns one row of `Tables`, a device table `[E + 1]`
int64: expert e's slot, or -1 - e where it is not resident (column E: the layer's shared
expert, the row after the slots where the tier holds it). The decode kernels take it as a
`kernels.moe_fused.Remap` and read a resident expert from its slot and any other in place from
the page-locked host store (under unified addressing the host pointer is a device pointer; the
reads cross PCIe), so the whole step (routing, expert kernels, everything) stays one fixed
kernel sequence, captured as one CUDA graph per batch size, and a miss costs its bytes over the
bus, not a host round trip. The same bytes go through the same kernel either way: the step's
arithmetic does not depend on where an expert lives (all-resident logits, bit for bit).

The host works while the GPU runs the next step (`routing_log.RoutingLog` hands each layer's
routed ids to its `InPlaceReads.settle` after the next launch). Each layer's routed ids are
counted by the slot map and its policy; up to `admit_per_step`
misses a layer that the policy `prefers` to its victim are admitted, every effect queued
behind the step just launched (which still reads the old table; an admission writes the host
copy of the tables no queued push is reading):
the victim is unmapped by the next table push, the expert is copied into its slot on the tier's
side stream once that step is done, and mapped by a later push once the copy has landed. A
slot map changed by an eager path (a prompt chunk admits and copies) is mirrored whole before
the next launch (`prepare`). Admissions are capped because a copy shares the bus with the
steps' in-place reads: with uniform routing every admission is traffic for nothing.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from ..kernels.moe_fused import Remap
from .handoff_policy import HandoffPolicy


class Tables:
    """Every in-place layer's table: `device [L, E + 1]` and two page-locked host copies, one
    written while a push queued behind a step in flight still reads the other, so the host
    never waits for the GPU to write; a push is one copy queued on the compute stream (after
    the step just launched). Column E is the layer's shared expert (`LayerTier.hold_shared`):
    its row after the slots."""

    def __init__(self, layers: int, experts: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = torch.zeros(layers, experts + 1, dtype=torch.long, device=device)
        self._hosts = [torch.zeros_like(self.device, device="cpu", pin_memory=self.cuda)
                       for _ in range(2)]
        self._rows = [h.numpy() for h in self._hosts]  # the same memory: a write is ~0.1 µs
        self._pushed: list = [None, None]  # each copy's last push (it is read until then)
        self._at = 0  # the copy written and pushed next
        self.dirty = False

    def writable(self) -> np.ndarray:
        """The host copy to write: the current one once its last push has read it, else the
        other one, brought up to date (waited for only while it is read by a push too)."""
        pushed = self._pushed[self._at]
        if pushed is not None and not pushed.query():
            other = 1 - self._at
            if self._pushed[other] is not None:
                self._pushed[other].synchronize()
            self._hosts[other].copy_(self._hosts[self._at])
            self._at = other
        self._pushed[self._at] = None
        return self._rows[self._at]

    def push(self) -> None:
        if not self.dirty:
            return
        self.device.copy_(self._hosts[self._at], non_blocking=True)
        if self.cuda:
            self._pushed[self._at] = torch.cuda.Event()
            self._pushed[self._at].record()
        self.dirty = False


class InPlaceReads:
    """See the module docstring; `tier` is the `LayerTier` it serves, `row` its table."""

    def __init__(self, tier, tables: Tables, row: int, admit_per_step: int = 1) -> None:
        self.tier, self.tables, self.row = tier, tables, row
        self.table = tables.device[row]
        self.admit_per_step = admit_per_step
        self.landing: list[tuple[object, list[tuple[int, int]]]] = []  # (event, [(e, slot)])
        self.read_pairs = 0  # (token, expert) pairs the kernels read from host memory
        # how many of a step's missed pairs the host's cores compute (`hand_misses`), or None;
        # the host jobs' records (`.pairs`, `.experts` computed) and how much of them is counted
        self.split: torch.Tensor | None = None
        self.policy: HandoffPolicy | None = None
        self.jobs: list = []
        self._folded = (0, 0)
        self.admitted = 0
        self.seen = -1  # the slot map's `changes` the table mirrors
        self.prepare()
        tables.push()

    def hand_misses(self, split: torch.Tensor, policy: HandoffPolicy | None = None) -> None:
        """From now on a step hands the host's cores `split[m]` of the layer's m missed pairs
        (int32 on the device, m past its end reading its last entry): the step's stage kernel
        maps the first that many misses' experts to the tier's zero row for this layer's
        kernels, which add nothing for them, and the host job computes them; the rest are
        read in place (`kernels.host_handoff`, `experts.host_jobs`). With a `policy`, only
        while it is on (`handing`); `settle` tells it each step's misses."""
        self.split, self.policy = split, policy
        self.tier.hold_zero_row()
        self.seen = -1  # mirrored whole by the next `prepare`

    @property
    def handing(self) -> bool:
        """Whether a step launched now hands misses to the host (a split, its policy on)."""
        return self.split is not None and (self.policy is None or self.policy.on)

    def _fold(self) -> None:
        """Count the pairs the host jobs computed as the CPU's, not device reads (`settle`
        counted every miss as read in place: the device picks the host's share a step)."""
        pairs = sum(j.pairs for j in self.jobs)
        experts = sum(j.experts for j in self.jobs)
        new_pairs, new_experts = pairs - self._folded[0], experts - self._folded[1]
        self._folded = (pairs, experts)
        t = self.tier
        t.cpu_pairs += new_pairs
        t.cpu_experts += new_experts
        t.device_pairs -= new_pairs
        self.read_pairs -= new_pairs

    def _set(self, e: int, value: int) -> None:
        self.tables.writable()[self.row, e] = value
        self.tables.dirty = True

    def prepare(self) -> None:
        """Mirror the slot map whole where an eager path or lending changed it (before a
        launch: the step must not read a slot whose expert was replaced)."""
        t = self.tier
        if t.map.changes == self.seen:
            return
        t._wait()  # copies in flight land before any later step reads their slots
        self.landing.clear()
        self.tables.writable()[self.row] = [*(s if s >= 0 else -1 - e
                                              for e, s in enumerate(t.map.slot_of)),
                                            t.shared_row or 0]
        self.tables.dirty = True
        self.seen = t.map.changes

    def remaps(self) -> tuple[Remap, Remap]:
        """The gate|up and down kernels' `Remap`s over the current slot stacks."""
        t = self.tier

        def remap(host, slots) -> Remap:
            return Remap(self.table, _elements(host.w, slots.w),
                         0 if host.scale is None else _elements(host.scale, slots.scale))
        return remap(t.host_gu, t.slot_gu), remap(t.host_down, t.slot_down)

    def _land(self) -> None:
        """Map in the experts whose copies have landed."""
        while self.landing and (self.landing[0][0] is None or self.landing[0][0].query()):
            for e, slot in self.landing.pop(0)[1]:
                if self.tier.map.slot_of[e] == slot:  # not evicted again since
                    self._set(e, slot)

    def settle(self, routed: list[int]) -> None:
        """One step's routed (token, expert) ids of this layer: counted, misses admitted."""
        t = self.tier
        self._land()
        if not routed:
            return
        pairs = Counter(routed)  # (token, expert) pairs per expert, counted once
        for e, n in pairs.items():
            t.routed[e] += n
        used = sorted(pairs)
        missing = t.map.lookup(used)
        t.device_pairs += len(routed)
        misses = sum(pairs[e] for e in missing)
        self.read_pairs += misses
        if self.policy is not None:
            self.policy.observe(misses)
        if self.jobs:
            self._fold()
        admitted, keep = [], set(used)
        # the victim is searched once (O(slots)), again only after an admission took it, and
        # not at all where the policy rules every admission out
        taken = (t.map.victim(keep) if missing and self.admit_per_step
                 and t.map.could_admit(missing) else None)
        for e in sorted(missing, key=pairs.__getitem__, reverse=True):  # the busiest first
            if taken is None:
                break
            slot, victim = taken
            if victim >= 0 and not t.map.policy.prefers(e, victim):
                continue
            t.map.admit(e, keep)
            if victim >= 0:
                self._set(victim, -1 - victim)  # not resident from the next step on
            admitted.append((e, slot))
            keep.add(e)  # not the next admission's victim
            taken = t.map.victim(keep) if len(admitted) < self.admit_per_step else None
        if admitted:
            for e, slot in admitted:
                t._copy_in(e, slot)  # after the compute stream's work: the step just launched
            self.landing.append((t.pending, admitted))
            self.admitted += len(admitted)
            if self.seen >= 0:  # a whole mirror pending stays pending
                self.seen = t.map.changes


def _elements(host: torch.Tensor, slots: torch.Tensor) -> int:
    """How many elements after `slots` `host` starts (the kernels' pointer offset)."""
    delta = host.data_ptr() - slots.data_ptr()
    assert delta % host.element_size() == 0 and host.dtype == slots.dtype, (delta, host.dtype)
    return delta // host.element_size()
