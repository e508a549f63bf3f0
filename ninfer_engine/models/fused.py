"""`FusedParams`: a Qwen3.5 parameter source that stores each decode GEMV group as one matrix.

The matrices one decode step multiplies by the same input (GDN q|k|v|z|b|a, attention
q|gate|k|v, MLP gate|up, shared-expert gate|up) live in one fused matrix and reach
`Qwen35Model` as row views of it; routed experts live in stacked `[E, 2I, H]` / `[E, H, I]`
tensors. The reference forward is unchanged (a row view multiplies like the matrix it was cut
from), while the static decoders run one GEMV per group and one grouped launch for the experts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..artifact.synth import parameter_shapes
from .packed import cat_rows

# member order inside each fused matrix
FUSED = {"gdn/": ["query", "key", "value", "z", "b_projection", "a_projection"],
         "attention/": ["query", "gate", "key", "value"], "mlp/": ["gate", "up"],
         "moe/shared/": ["gate", "up"]}


class FusedParams:
    """A `Qwen35Model` parameter source that fuses each decode GEMV group into one matrix.

    Every tensor comes from `source(name, shape)`; members of a fused group are copied into the
    group's matrix on first use and returned as row views of it (the key is `prefix + group`,
    e.g. `text/layers/3/mlp/`), routed experts into `prefix + moe/experts/gate_up|down`.
    """

    def __init__(self, config: dict, source: Callable[[str, tuple[int, ...]], torch.Tensor]):
        self.c, self.source = config, source
        self.shapes = parameter_shapes(config)
        self.fused: dict[str, torch.Tensor] = {}

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

    def _expert(self, name: str) -> torch.Tensor:
        """Expert e's gate/up rows of the stacked [E, 2I, H] tensor, or its [H, I] down."""
        prefix, rest = name.split("/moe/experts/")
        e, member = rest.split("/")
        e, width = int(e), self.c["moe_intermediate_size"]
        key = prefix + "/moe/experts/"
        if key + "down" not in self.fused:
            E, h = self.c["num_experts"], self.c["hidden_size"]
            like = self.source(f"{key}0/down", (h, width))  # only for the device and dtype
            gate_up, down = like.new_empty((E, 2 * width, h)), like.new_empty((E, h, width))
            for x in range(E):  # filled expert by expert: no second full-size copy
                gate_up[x, :width] = self.source(f"{key}{x}/gate", (width, h))
                gate_up[x, width:] = self.source(f"{key}{x}/up", (width, h))
                down[x] = self.source(f"{key}{x}/down", (h, width))
            self.fused[key + "gate_up"], self.fused[key + "down"] = gate_up, down
        if member == "down":
            return self.fused[key + "down"][e]
        start = 0 if member == "gate" else width
        return self.fused[key + "gate_up"][e, start : start + width]
