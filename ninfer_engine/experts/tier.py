"""`LayerTier`: one MoE layer's routed experts over device slots and the host store.

Every expert of the layer is in the host store (`HostExperts`); `slots` of them are resident
in one stacked tensor of device slots (`slot_gu [S, 2I, H]`, `slot_down [S, H, I]`, the form
the expert kernels read) under a `SlotMap`. Each step, for each routed expert that is not
resident (a miss), the layer either copies it into a slot (the policy's victim evicted; on
CUDA on a side stream, the expert kernels wait on its event) or computes it on the CPU from
the host store in fp32, by the measured `MissCosts` (`miss="auto"`) or always one way
(`"copy"`, `"cpu"`).

- `experts_sorted(xs, counts)`: the torch path (`SparseMoE._experts_sorted`: prefill chunks,
  the CPU engine): experts one at a time, hits first, then each miss copied and computed before
  the next is admitted, so one slot suffices and the copy path equals all-resident bit for bit
  (same weights, same torch calls).
- `decode(y, ids, weights, k)`: the decode kernels' path (`HybridStep._moe`): every routed
  expert of the step must be resident at once, so a miss that finds no slot outside the step's
  own experts runs on the CPU; returns the slot ids the kernels read, the weights with the CPU
  pairs zeroed, and the CPU pairs' weighted sum to add. With prefetch on, the same host sync
  also brings the next MoE layer's router top-k over this layer's input, whose non-resident
  experts are copied into that layer's slots while this one computes (Pre-gated MoE's guess).

- the captured step (`HybridStep._moe` with `in_place`, `experts.in_place`): no host sync;
  the kernels read misses in place from the host store, admissions happen between steps.

CPU compute (`cpu_expert`, `cpu_sum`) is the expert in fp32, from the base class
`host_compute.HostCompute`; on the GPU it is the bf16 kernels', so the two differ by the GPU
side's bf16 rounding.
"""
from __future__ import annotations

import itertools
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ..models.experts import ExpertStack
from ..models.packed import linear
from .cost_model import MissCosts
from .host_compute import HostCompute
from .slot_cache import SlotMap, SlotPolicy


def empty_slots(like: ExpertStack, slots: int, device) -> ExpertStack:
    """`slots` device slots in `like`'s form."""
    w = torch.empty((slots, *like.w.shape[1:]), dtype=like.w.dtype, device=device)
    scale = None if like.scale is None else torch.empty(
        (slots, *like.scale.shape[1:]), dtype=like.scale.dtype, device=device)
    return ExpertStack(w, scale)


def _copy_row(dst: ExpertStack, row: int, src: ExpertStack, at: int) -> None:
    dst.w[row].copy_(src.w[at])
    if src.scale is not None:
        dst.scale[row].copy_(src.scale[at])


def _same_form(a: ExpertStack, b: ExpertStack) -> bool:
    """Whether a row of `a` goes into `b` as it is (same dtype, same scale layout)."""
    if a.w.dtype != b.w.dtype or a.w.shape[1:] != b.w.shape[1:]:
        return False
    if a.scale is None or b.scale is None:
        return a.scale is None and b.scale is None
    return a.scale.dtype == b.scale.dtype and a.scale.shape[1:] == b.scale.shape[1:]


def _to(t: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if t is None else t.to(device)


class LayerTier(HostCompute):
    """See the module docstring; `width` is the experts' intermediate size I."""

    def __init__(self, host: tuple[ExpertStack, ExpertStack], slots: int, width: int, device,
                 policy: SlotPolicy, miss: str = "auto", costs: MissCosts | None = None):
        self.host_gu, self.host_down = host
        self.width, self.device, self.miss, self.costs = width, torch.device(device), miss, costs
        self.experts = self.host_gu.w.shape[0]
        self.map = SlotMap(self.experts, slots, policy)
        self.slot_gu = empty_slots(self.host_gu, slots, device)
        self.slot_down = empty_slots(self.host_down, slots, device)
        self.expert_bytes = self.host_gu.expert_bytes + self.host_down.expert_bytes
        cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.pending = None  # the side stream's event after the step's copies
        self.device_pairs = self.cpu_pairs = self.bytes_copied = 0
        self.cpu_experts = 0  # experts computed on the CPU (each reads its host bytes once)
        self.routed = [0] * self.experts  # (token, expert) pairs per expert: the popularity
        # next-layer prefetch (`ExpertTiers(prefetch=True)`): the next MoE layer's tier and
        # router, whose top-k over this layer's input is copied ahead; experts it copied
        self.next: LayerTier | None = None
        self.next_router: torch.Tensor | None = None
        self.prefetched = 0
        # the captured step's path (`in_place.InPlaceReads`), where `ExpertTiers` gives one
        self.in_place = None
        # the layer's shared expert as one more row after the slots (`hold_shared`): the
        # decode kernels then run it as routed slot k, as they do over a stacked layer
        self.shared: tuple[ExpertStack, ExpertStack] | None = None
        self.zero_row = False  # `hold_zero_row`
        for s in range(slots):
            self._copy_in(s, s)
        self._wait()
        self.bytes_copied = 0  # the initial fill is loading, not traffic

    # -- slots ------------------------------------------------------------------------------

    def _copy_in(self, expert: int, slot: int) -> None:
        """Host expert → device slot: asynchronous on the side stream where CUDA is."""
        if self.stream is not None:  # the slot's last readers finish before it is written
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            for src, dst in ((self.host_gu, self.slot_gu), (self.host_down, self.slot_down)):
                dst.w[slot].copy_(src.w[expert], non_blocking=True)
                if src.scale is not None:
                    dst.scale[slot].copy_(src.scale[expert], non_blocking=True)
            if self.stream is not None:
                self.pending = torch.cuda.Event()
                self.pending.record(self.stream)
        self.bytes_copied += self.expert_bytes

    def _wait(self) -> None:
        """The compute stream waits for the step's copies (the host does not)."""
        if self.pending is not None:
            torch.cuda.current_stream(self.device).wait_event(self.pending)
            self.pending = None

    def resize(self, slots: int) -> None:
        """Grow or shrink the slot stacks (lending); kept experts move to their new slots,
        the shared expert and the zero row stay after them."""
        self._wait()  # no copy into the old stacks is still in flight when they are freed
        old = self.map.resize(slots)
        for i, name in enumerate(("slot_gu", "slot_down")):
            prev = getattr(self, name)
            new = empty_slots(prev, self.rows, self.device)
            for s, o in enumerate(old):
                if o >= 0:
                    _copy_row(new, s, prev, o)
            if self.shared is not None:
                _copy_row(new, slots, self.shared[i], 0)
            if self.zero_row:
                for plane in (new.w, new.scale):
                    if plane is not None:
                        plane[self.cpu_row].view(torch.uint8).zero_()
            setattr(self, name, new)

    def hold_shared(self, gu: ExpertStack, down: ExpertStack) -> bool:
        """Keep the layer's shared expert (one-expert stacks `gu`, `down`) as the row after
        the slots, where it is in the slots' form (else nothing changes: False). Its id in a
        routing that includes it (`kernels.moe_route`, shared=True) is `experts`, which the
        in-place table maps to that row (`in_place.InPlaceReads.prepare`)."""
        if not all(_same_form(a, b) for a, b in ((gu, self.slot_gu), (down, self.slot_down))):
            return False
        self.shared = (ExpertStack(gu.w.to(self.device), _to(gu.scale, self.device)),
                       ExpertStack(down.w.to(self.device), _to(down.scale, self.device)))
        self.resize(self.map.slots)  # the same slots, one row more
        return True

    @property
    def shared_row(self) -> int | None:
        """The stacks' row of the shared expert (after the slots), None without one."""
        return None if self.shared is None else self.map.slots

    def hold_zero_row(self) -> None:
        """Keep an all-zero expert as the stacks' last row (`cpu_row`): the captured step's
        table maps an expert computed on the host's cores there (`host_jobs`), so the device
        kernels add nothing for it and read no host memory."""
        if not self.zero_row:
            self.zero_row = True
            self.resize(self.map.slots)

    @property
    def cpu_row(self) -> int | None:
        """The stacks' zero row (after the slots and the shared expert), None without one."""
        return self.rows - 1 if self.zero_row else None

    @property
    def rows(self) -> int:
        """Rows of the slot stacks: the slots, then the shared expert and the zero row where
        held."""
        return self.map.slots + (self.shared is not None) + self.zero_row

    # -- misses -----------------------------------------------------------------------------

    def _on_cpu(self, rows: int, hidden: int) -> bool:
        if self.miss != "auto":
            return self.miss == "cpu"
        return self.costs is not None and self.costs.prefer_cpu(rows, self.expert_bytes,
                                                                 4 * hidden)

    def _slot_expert(self, x: torch.Tensor, s: int) -> torch.Tensor:
        gate = linear(x, self.slot_gu.member(s, 0, self.width))
        up = linear(x, self.slot_gu.member(s, self.width, 2 * self.width))
        return linear(F.silu(gate) * up, self.slot_down.member(s))

    def experts_sorted(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts over expert-sorted rows `xs`, `counts[e]` rows for expert e."""
        self._wait()  # a prefetch into these slots has landed before a hit reads one
        sizes = counts.tolist()  # the one host sync
        starts = [0, *itertools.accumulate(sizes)]
        used = [e for e, n in enumerate(sizes) if n]
        for e in used:
            self.routed[e] += sizes[e]
        missing = set(self.map.lookup(used))
        out = torch.empty_like(xs)
        for e in sorted(used, key=lambda e: e in missing):  # hits first, then each miss
            rows = slice(starts[e], starts[e] + sizes[e])
            if e in missing and self._on_cpu(sizes[e], xs.shape[1]):
                y = self.cpu_expert(xs[rows].cpu(), e)
                out[rows] = y.to(xs.device, xs.dtype)
                self.cpu_pairs += sizes[e]
                self.cpu_experts += 1
                continue
            if e in missing:
                self._copy_in(e, self.map.admit(e, set()))
                self._wait()
            out[rows] = self._slot_expert(xs[rows], self.map.slot_of[e])
            self.device_pairs += sizes[e]
        return out

    def _guess(self, y: torch.Tensor, k: int) -> torch.Tensor | None:
        """The next MoE layer's top-k for this layer's input rows (the residual stream moves
        little from one layer to the next), when prefetching; None otherwise."""
        if self.next is None:
            return None
        return torch.topk(F.linear(y, self.next_router), k, -1).indices.flatten()

    def prefetch(self, experts: list[int]) -> None:
        """Copy `experts` (guessed for this layer's coming step) into slots, none evicting
        another; no lookup is counted (the step's own lookup counts them as hits)."""
        for e in experts:
            if self.map.slot_of[e] < 0:
                slot = self.map.admit(e, set(experts))
                if slot is None:
                    return
                self._copy_in(e, slot)
                self.prefetched += 1

    def decode(self, y: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, k: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(slot ids [B·k], weights [B, k] with the CPU pairs zeroed, the CPU pairs' weighted
        sum [B, H] fp32 on the device or None) for routing `ids [B·k]` of rows `y [B, H]`."""
        guess = self._guess(y, k)
        host = (ids if guess is None else torch.cat([ids, guess])).tolist()  # the one sync
        routed, guessed = host[: ids.numel()], sorted(set(host[ids.numel():]))
        used = sorted(set(routed))
        for e in routed:
            self.routed[e] += 1
        on_cpu = set()
        for e in self.map.lookup(used):
            rows = routed.count(e)
            slot = None if self._on_cpu(rows, y.shape[1]) else self.map.admit(e, set(used))
            if slot is None:
                on_cpu.add(e)
            else:
                self._copy_in(e, slot)
        if guessed:  # copied while this layer computes (and the next one's mixer runs)
            self.next.prefetch(guessed)
        slots = torch.tensor([max(self.map.slot_of[e], 0) for e in routed], dtype=torch.long)
        cpu_sum = None
        if on_cpu:
            keep = torch.tensor([e not in on_cpu for e in routed]).view(-1, k)
            w_host = weights.float().cpu().view(-1).tolist()
            pairs = [i for i, e in enumerate(routed) if e in on_cpu]
            total = self.cpu_sum(y.cpu(), [i // k for i in pairs], [routed[i] for i in pairs],
                                   [w_host[i] for i in pairs])
            weights = weights * keep.to(weights.device, weights.dtype)
            cpu_sum = total.to(y.device)
        self.cpu_pairs += sum(e in on_cpu for e in routed)
        self.cpu_experts += len(on_cpu)
        self.device_pairs += sum(e not in on_cpu for e in routed)
        self._wait()
        return slots.to(y.device), weights, cpu_sum

