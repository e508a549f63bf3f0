"""The captured decode step's path for offloaded experts: no host sync inside the step.

`InPlaceReads` (one per `LayerTier` whose misses are `read`: `--expert-miss read`, and `auto`
where the stacks are bf16 or fp8-row) keeps a device table `[E]` int64: expert e's slot, or
-1 - e where it is not resident. The decode kernels take it as a `kernels.moe_fused.Remap` and
read a resident expert from its slot and any other in place from the page-locked host store
(under unified addressing the host pointer is a device pointer; the reads cross PCIe), so the
whole step (routing, expert kernels, everything) stays one fixed kernel sequence, captured as
one CUDA graph per batch size, and a miss costs its bytes over the bus, not a host round trip.
The same bytes go through the same kernel either way: the step's arithmetic does not depend
on where an expert lives (all-resident logits, bit for bit, where the kernels are).

Between steps (`settle`, from `RoutingLog.settle` before the next step is loaded): the step's
routed ids (one read for every layer, after the step's own sync) are counted by the slot map
and its policy; up to `admit_per_step` misses a layer that the policy `prefers` to its victim
are admitted: the victim is unmapped before the next step runs, the expert is copied into its
slot on the tier's side stream while that step runs, and it is mapped once its copy has
landed (`_land`, a later settle). Admissions are capped because a copy shares the bus with
the next step's in-place reads: with uniform routing every admission is traffic for nothing.

`RoutingLog`: where the step writes its offloaded layers' routed ids (`route_topk_triton`'s
`ids_out`), filled with -1 after each read so a row the step did not run is not counted.
"""
from __future__ import annotations

import torch

from ..kernels.moe_fused import Remap


class InPlaceReads:
    """See the module docstring; `tier` is the `LayerTier` it serves."""

    def __init__(self, tier, admit_per_step: int = 1) -> None:
        self.tier, self.admit_per_step = tier, admit_per_step
        experts = tier.experts
        self.table_host = torch.empty(experts, dtype=torch.long)
        self.table = torch.empty(experts, dtype=torch.long, device=tier.device)
        self.landing: list[tuple[object, list[tuple[int, int]]]] = []  # (event, [(e, slot)])
        self.read_pairs = 0  # (token, expert) pairs the kernels read from host memory
        self.admitted = 0
        self.seen = -1  # the slot map's `changes` the table mirrors
        self.sync()

    def sync(self) -> None:
        """Mirror the slot map whole (after an eager path admitted or lending resized)."""
        t = self.tier
        t._wait()  # copies in flight land before any later step reads their slots
        self.landing.clear()
        self.table_host.copy_(torch.tensor([s if s >= 0 else -1 - e
                                            for e, s in enumerate(t.map.slot_of)]))
        self._push()
        self.seen = t.map.changes

    def _push(self) -> None:
        self.table.copy_(self.table_host)  # from pageable memory: rewritable once it returns

    def remaps(self) -> tuple[Remap, Remap]:
        """The gate|up and down kernels' `Remap`s over the current slot stacks."""
        t = self.tier

        def remap(host, slots) -> Remap:
            return Remap(self.table, _elements(host.w, slots.w),
                         0 if host.scale is None else _elements(host.scale, slots.scale))
        return remap(t.host_gu, t.slot_gu), remap(t.host_down, t.slot_down)

    def _land(self) -> bool:
        """Map in the experts whose copies have landed; whether the table changed."""
        changed = False
        while self.landing and (self.landing[0][0] is None or self.landing[0][0].query()):
            for e, slot in self.landing.pop(0)[1]:
                if self.tier.map.slot_of[e] == slot:  # not evicted again since
                    self.table_host[e] = slot
                    changed = True
        return changed

    def settle(self, routed: list[int]) -> None:
        """One step's routed (token, expert) ids of this layer (none: the table brought up to
        date only): counted, misses admitted."""
        t = self.tier
        if t.map.changes != self.seen:
            self.sync()
        changed = self._land()
        if not routed:
            if changed:
                self._push()
            return
        for e in routed:
            t.routed[e] += 1
        used = sorted(set(routed))
        missing = t.map.lookup(used)
        t.device_pairs += len(routed)
        self.read_pairs += sum(routed.count(e) for e in missing)
        admitted, keep = [], set(used)
        for e in sorted(missing, key=routed.count, reverse=True):  # the step's busiest first
            if len(admitted) == self.admit_per_step:
                break
            taken = t.map.victim(keep)
            if taken is None:
                break
            slot, victim = taken
            if victim >= 0 and not t.map.policy.prefers(e, victim):
                continue
            t.map.admit(e, keep)
            if victim >= 0:
                self.table_host[victim] = -1 - victim  # read in place from the next step on
            admitted.append((e, slot))
        if admitted:
            for e, slot in admitted:
                t._copy_in(e, slot)  # after the compute stream's earlier reads of the slot
            self.landing.append((t.pending, admitted))
            self.admitted += len(admitted)
            self.seen = t.map.changes
            changed = True
        if changed:
            self._push()


def _elements(host: torch.Tensor, slots: torch.Tensor) -> int:
    """How many elements after `slots` `host` starts (the kernels' pointer offset)."""
    delta = host.data_ptr() - slots.data_ptr()
    assert delta % host.element_size() == 0 and host.dtype == slots.dtype, (delta, host.dtype)
    return delta // host.element_size()


class RoutingLog:
    """The routed ids of a decode step's in-place MoE layers (see the module docstring)."""

    def __init__(self, layers: list[dict], rows: int, device) -> None:
        tiered = [lay for lay in layers if getattr(lay.get("tier"), "in_place", None)]
        self.tiers = [lay["tier"] for lay in tiered]
        self.row = {id(t): i for i, t in enumerate(self.tiers)}
        k = max((lay["moe"].top_k for lay in tiered), default=0)
        self.ids = (torch.full((len(tiered), rows * k), -1, dtype=torch.long, device=device)
                    if tiered else None)

    def out(self, tier, rows: int, k: int) -> torch.Tensor | None:
        """Where the step's router writes `tier`'s ids `[rows, k]`; None for other layers."""
        if tier is None or id(tier) not in self.row:
            return None
        return self.ids[self.row[id(tier)], : rows * k].view(rows, k)

    def settle(self) -> None:
        """Hand the last step's routing to the tiers (one read for every layer)."""
        if self.ids is None:
            return
        log = self.ids.tolist()
        self.discard()
        for tier, row in zip(self.tiers, log):  # every layer: an eager chunk may have admitted
            tier.in_place.settle([e for e in row if e >= 0])

    def discard(self) -> None:
        """Forget what the step wrote (a capture's warm-up run, not a step of the engine)."""
        if self.ids is not None:
            self.ids.fill_(-1)
