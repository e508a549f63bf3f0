"""`FusedParams`: a Qwen3.5 parameter source that stores each decode GEMV group as one matrix.

The matrices one decode step multiplies by the same input (GDN q|k|v|z|b|a, attention
q|gate|k|v, MLP gate|up, shared-expert gate|up) live in one fused matrix and reach
`Qwen35Model` as row views of it; routed experts live in stacked `[E, 2I, H]` / `[E, H, I]`
`experts.ExpertStack`s (bf16, or e4m3 codes + scales where the experts are served fp8). The
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
         "moe/shared/": ["gate", "up"]}


class FusedParams:
    """A `Qwen35Model` parameter source that fuses each decode GEMV group into one matrix.

    Every tensor comes from `source(name, shape)`; members of a fused group are copied into the
    group's matrix on first use and returned as row views of it (the key is `prefix + group`,
    e.g. `text/layers/3/mlp/`), routed experts into the `ExpertStack`s `prefix +
    moe/experts/gate_up|down`.
    """

    def __init__(self, config: dict, source: Callable[[str, tuple[int, ...]], torch.Tensor]):
        self.c, self.source = config, source
        self.shapes = parameter_shapes(config)
        self.fused: dict = {}  # fused matrices and expert stacks

    def __call__(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if "/moe/experts/" in name:
            return self._expert(name)
        for group, members in FUSED.items():
            prefix, _, member = name.rpartition(group)
            if member in members and prefix.startswith("text/layers/"):
                key = prefix + group
                if key not in self.fused:
                    self.fused[key] = cat_rows([self.source(key + m, self.shapes[key + m])
                                                 for m in members])
                rows = [self.shapes[key + m][0] for m in members]
                start = sum(rows[: members.index(member)])
                return self.fused[key][start : start + shape[0]]
        return self.source(name, shape)

    def _expert(self, name: str) -> torch.Tensor | PackedMatrix:
        """Expert e's gate/up rows of the layer's gate|up `ExpertStack`, or its down: bf16
        views, or one-block `PackedMatrix` views of fp8 codes and scales
        (`models.experts`)."""
        prefix, rest = name.split("/moe/experts/")
        e, member = rest.split("/")
        e, width = int(e), self.c["moe_intermediate_size"]
        key = prefix + "/moe/experts/"
        if key + "down" not in self.fused:
            self.fused[key + "gate_up"], self.fused[key + "down"] = stack_experts(
                lambda x, m, shape: self.source(f"{key}{x}/{m}", shape),
                self.c["num_experts"], width, self.c["hidden_size"])
        if member == "down":
            return self.fused[key + "down"].member(e)
        start = 0 if member == "gate" else width
        return self.fused[key + "gate_up"].member(e, start, start + width)
