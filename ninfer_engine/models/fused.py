"""`FusedParams`: a Qwen3.5 parameter source that stores each decode GEMV group as one matrix.

The matrices one decode step multiplies by the same input (GDN q|k|v|z|b|a, attention
q|gate|k|v, MLP gate|up, MoE router|shared-expert score|shared gate|up) live in one fused
matrix and reach `Qwen35Model` as row views of it; routed experts live in stacked
`[E, 2I, H]` / `[E, H, I]` `experts.ExpertStack`s (bf16, or e4m3 codes + scales where the
experts are served fp8). Where the shared expert is stored in the stacks' form it is stacked
as expert E instead (`shared_in_stack`; its members are views of the stacks and the MoE group
is router|score only), so the decode step runs it as a ninth slot of the routed kernels. The
reference forward is unchanged (a row view multiplies like the matrix it was cut from), while
the static decoders run one GEMV per group and one grouped launch for the experts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..artifact.synth import parameter_shapes
from .experts import stack_experts
from .packed import PackedMatrix, cat_rows

# member order inside each fused matrix
FUSED = {"gdn/": ["query", "key", "value", "z", "b_projection", "a_projection"],
         "attention/": ["query", "gate", "key", "value"], "mlp/": ["gate", "up"],
         "moe/": ["router", "shared_score", "shared/gate", "shared/up"]}
SHARED = ("shared/gate", "shared/up", "shared/down")


class FusedParams:
    """A `Qwen35Model` parameter source that fuses each decode GEMV group into one matrix.

    Every tensor comes from `source(name, shape)`; members of a fused group are copied into the
    group's matrix on first use and returned as row views of it (the key is `prefix + group`,
    e.g. `text/layers/3/mlp/`, or the MTP head's `mtp/layers/0/mlp/`), routed experts into the
    `ExpertStack`s `prefix + moe/experts/gate_up|down`.
    """

    def __init__(self, config: dict, source: Callable[[str, tuple[int, ...]], torch.Tensor],
                 tiers=None):
        self.c, self.source = config, source
        self.tiers = tiers  # offloaded routed experts (`experts.ExpertTiers`): their slots
        self.shapes = parameter_shapes(config, mtp=True)  # (and the MTP head's layer)
        self.fused: dict = {}  # fused matrices and expert stacks
        # the routed experts this rank stacks: [start, end) under tensor parallelism by id
        self._experts = tuple(config.get("tp_local_experts", (0, config.get("num_experts", 0))))

    def __call__(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if "/moe/experts/" in name:
            prefix, rest = name.split("/moe/experts/")
            e, member = rest.split("/")
            return self._expert(prefix + "/moe/", int(e), member)
        for group, members in FUSED.items():
            prefix, _, member = name.rpartition(group)
            if (prefix.startswith(("text/layers/", "mtp/layers/"))
                    and (member in members or member in SHARED)):
                key = prefix + group
                if group == "moe/":
                    self._stacks(key)  # decides whether the shared expert is in the stacks
                    if self.shared_in_stack(key):
                        members = members[:2]
                        if member in SHARED and self._tier(key) is not None:
                            return self.source(name, shape)  # the slot stacks hold a copy
                        if member in SHARED:
                            return self._expert(key, self._experts[1], member[7:])
                    if member not in members:  # shared/down outside the stacks
                        return self.source(name, shape)
                if key not in self.fused:
                    self.fused[key] = cat_rows([self.source(key + m, self.shapes[key + m])
                                                 for m in members])
                rows = [self.shapes[key + m][0] for m in members]
                start = sum(rows[: members.index(member)])
                return self.fused[key][start : start + shape[0]]
        return self.source(name, shape)

    def shared_in_stack(self, moe_key: str) -> bool:
        """Whether layer `moe_key` (`text/layers/i/moe/`)'s shared expert is stacked as expert
        E of its routed-expert stacks (see the module docstring)."""
        tier = self._tier(moe_key)
        if tier is not None:  # the row after the slots, where the tier holds it
            return tier.shared is not None
        first, end = self._experts
        return self.fused[moe_key + "experts/down"].w.shape[0] > end - first

    def _stacks(self, key: str) -> None:
        """Build layer `key` (`text/layers/i/moe/`)'s expert stacks, once; the shared expert
        joins them when it has the routed width and their form (`experts.stack_experts`)."""
        if key + "experts/down" in self.fused:
            return
        width = self.c["moe_intermediate_size"]
        shared = None
        if self.c.get("shared_expert_intermediate_size") == width:
            shared = lambda m, shape: self.source(f"{key}shared/{m}", shape)  # noqa: E731
        tier = self._tier(key)
        if tier is not None:
            # the captured step runs the shared expert as a slot (a host-synced step, or a
            # shared expert of another width or form, keeps it apart)
            if shared is not None and tier.in_place is not None:
                tier.hold_shared(*stack_experts(lambda e, m, shape: shared(m, shape), 1, width,
                                                self.c["hidden_size"]))
            self.fused[key + "experts/gate_up"] = tier.slot_gu
            self.fused[key + "experts/down"] = tier.slot_down
            return
        first, end = self._experts
        self.fused[key + "experts/gate_up"], self.fused[key + "experts/down"] = stack_experts(
            lambda x, m, shape: self.source(f"{key}experts/{first + x}/{m}", shape),
            end - first, width, self.c["hidden_size"], shared)

    def _tier(self, moe_key: str):
        """The `experts.LayerTier` of an offloaded layer's routed experts, else None."""
        return None if self.tiers is None else self.tiers.tier(moe_key)

    def _expert(self, key: str, e: int, member: str) -> torch.Tensor | PackedMatrix:
        """Expert e's gate/up rows of layer `key`'s gate|up `ExpertStack`, or its down: bf16
        views, or one-block `PackedMatrix` views of fp8 codes and scales
        (`models.experts`)."""
        self._stacks(key)
        if self._tier(key) is not None:  # a meta placeholder
            return self.source(f"{key}experts/{e}/{member}", self.shapes[
                f"{key}experts/{e}/{member}"])
        width, e = self.c["moe_intermediate_size"], e - self._experts[0]  # its stack row
        if member == "down":
            return self.fused[key + "experts/down"].member(e)
        start = 0 if member == "gate" else width
        return self.fused[key + "experts/gate_up"].member(e, start, start + width)
