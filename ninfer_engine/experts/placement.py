"""Where routed experts live: device slots from a budget, the rest in host RAM (issue 20).

`plan_placement` turns the device memory routed experts may use (`--expert-vram-mib`, or the
VRAM left after the other weights, the KV floor and the headroom under `auto`) into a number of
device slots per MoE layer, the same for every layer. When every expert fits, nothing changes:
the experts are stacked on the device as before (no tier). Otherwise every MoE layer keeps all
of its routed experts in one host allocation (`host_store.HostExperts`, page-locked when CUDA
is present) and its slots cache the ones routing asks for (`slot_cache`): a slot is evicted
without a write-back, and the cache follows routing instead of fixing a pinned set before any
token is seen. The price is host RAM for the whole expert set of those layers, which
`check_ram_guard` checks against free RAM before anything is allocated.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

GIB = 2**30
MIB = 2**20


class RamGuardError(RuntimeError):
    """The host expert allocation does not fit in free RAM: one line, startup exits 1."""


@dataclass(frozen=True)
class ExpertPlacement:
    """`slots` device slots in each of the MoE `layers` for `experts` routed experts of
    `expert_bytes` each (as served: codes + scales, or plain weights)."""

    experts: int
    layers: tuple[int, ...]
    slots: int
    expert_bytes: int

    @property
    def offloaded(self) -> bool:
        return self.slots < self.experts

    @property
    def device_bytes(self) -> int:
        """Device bytes of the routed experts (the slots, or every expert without a tier)."""
        return min(self.slots, self.experts) * len(self.layers) * self.expert_bytes

    @property
    def host_bytes(self) -> int:
        """Bytes of the one host allocation (every routed expert of the offloaded layers)."""
        return self.experts * len(self.layers) * self.expert_bytes if self.offloaded else 0

    @property
    def host_share(self) -> float:
        """Share of the routed experts not resident on the device at any time."""
        return 1.0 - min(self.slots, self.experts) / self.experts


def moe_layers(config: dict) -> tuple[int, ...]:
    """The layers whose FFN is the sparse MoE (`qwen3_5._Block`)."""
    if not config.get("num_experts"):
        return ()
    dense = set(config.get("mlp_only_layers", []))
    return tuple(i for i in range(config["num_hidden_layers"]) if i not in dense)


def plan_placement(config: dict, expert_bytes: int, budget_bytes: int | None) -> ExpertPlacement:
    """Slots per MoE layer from `budget_bytes` of device memory (None: every expert resident).

    A tier needs at least one slot a layer: a copied miss runs from a slot (`tier`)."""
    layers = moe_layers(config)
    experts = config.get("num_experts", 0)
    if budget_bytes is None or not layers:
        return ExpertPlacement(experts, layers, experts, expert_bytes)
    slots = min(experts, budget_bytes // (len(layers) * expert_bytes))
    if slots < 1:
        raise ValueError(
            f"--expert-vram-mib: {budget_bytes / MIB:.1f} MiB holds no expert slot: one slot in "
            f"each of {len(layers)} MoE layers takes {len(layers) * expert_bytes / MIB:.1f} MiB")
    return ExpertPlacement(experts, layers, slots, expert_bytes)


def auto_budget(free_bytes: int, other_weight_bytes: int, kv_floor_bytes: int,
                headroom_bytes: int) -> int:
    """`--expert-vram-mib auto`: the device memory free before loading, less the weights that
    are not routed experts, the KV pool's floor (--max-context tokens) and the headroom."""
    return max(free_bytes - other_weight_bytes - kv_floor_bytes - headroom_bytes, 0)


def check_ram_guard(host_bytes: int, environ: dict[str, str] | None = None,
                    available: int | None = None) -> None:
    """Refuse (`RamGuardError`) when the host expert allocation exceeds free RAM, unless
    `NINFER_RAM_GUARD=0`."""
    environ = os.environ if environ is None else environ
    if not host_bytes or environ.get("NINFER_RAM_GUARD", "1") == "0":
        return
    free = psutil.virtual_memory().available if available is None else available
    if host_bytes > free:
        raise RamGuardError(
            f"routed experts need {host_bytes / GIB:.2f} GiB of page-locked host RAM but only "
            f"{free / GIB:.2f} GiB is free: raise --expert-vram-mib, free RAM, or set "
            f"NINFER_RAM_GUARD=0 to start anyway")
