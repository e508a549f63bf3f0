"""`HostExperts`: every routed expert of the offloaded MoE layers in one host allocation.

The experts are kept in their serving form (`models.experts`: e4m3 codes + row or group scales
where the device serves them fp8, i.e. fp8-row as stored and Q4/Q5 repacked exactly; otherwise
the device's plain dtype: bf16 on CUDA, fp32 on the CPU reference), so that a copy into a
device slot is a byte copy, exact by construction. One allocation (page-locked when CUDA is
present, so slot copies run asynchronously on a side stream) is carved into per-layer
`ExpertStack` views, gate|up `[E, 2I, H]` and down `[E, H, I]`, with 64-byte aligned planes.
"""
from __future__ import annotations

from collections.abc import Callable

import math

import torch

from ..models.experts import ExpertStack, put_member, stack_experts

ALIGN = 64

# (layer, expert, member "gate"|"up"|"down", shape) -> the member in its serving form
ExpertGetter = Callable[[int, int, str, tuple[int, int]], object]


def _planes(stack: ExpertStack) -> list[torch.Tensor]:
    return [stack.w] if stack.scale is None else [stack.w, stack.scale]


class HostExperts:
    """Gate|up and down stacks of every routed expert of `layers`, in one host buffer."""

    def __init__(self, get: ExpertGetter, layers: tuple[int, ...], experts: int, width: int,
                 hidden: int, pin: bool) -> None:
        self.layers, self.experts = layers, experts
        # expert 0 of the first layer fixes the form (and dtypes) of every stack
        probe = stack_experts(lambda e, m, shape: get(layers[0], 0, m, shape), 1, width, hidden)
        layout = [(p.shape[1:], p.dtype) for s in probe for p in _planes(s)]
        sizes = [experts * math.prod(shape) * dtype.itemsize for shape, dtype in layout]
        per_layer = sum(-(-n // ALIGN) * ALIGN for n in sizes)
        self.nbytes = per_layer * len(layers)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        self.stacks: dict[int, tuple[ExpertStack, ExpertStack]] = {}
        at = 0
        for layer in layers:
            planes = []
            for (shape, dtype), n in zip(layout, sizes):
                raw = self.buffer[at: at + n]
                planes.append(raw.view(dtype).view(experts, *shape))
                at += -(-n // ALIGN) * ALIGN
            gate_up = ExpertStack(*planes[: len(_planes(probe[0]))])
            down = ExpertStack(*planes[len(_planes(probe[0])):])
            self.stacks[layer] = (gate_up, down)
            for e in range(experts):
                put_member(gate_up, e, 0, get(layer, e, "gate", (width, hidden)))
                put_member(gate_up, e, width, get(layer, e, "up", (width, hidden)))
                put_member(down, e, 0, get(layer, e, "down", (hidden, width)))

    @property
    def expert_bytes(self) -> int:
        gate_up, down = self.stacks[self.layers[0]]
        return gate_up.expert_bytes + down.expert_bytes

