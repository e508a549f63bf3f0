"""Random-weight Qwen3.5 stacks built on the GPU for `bench/gpu_decode.py`.

The decode step itself is `ninfer_engine.benchmark.decode.KernelDecoder`.
`RandomParams` is a parameter source for `Qwen35Model` that draws every tensor on the device;
the matrices one decode step multiplies by the same input (GDN q|k|v|z|b|a, attention
q|gate|k|v, MLP gate|up) are drawn as one fused matrix and handed out as row views, so the
kernel step reads exactly the reference model's weights with one GEMV per group.

Routed experts are drawn as stacked `[E, 2I, H]` / `[E, H, I]` tensors, each expert a view.
"""

from __future__ import annotations

import math

import torch

from ninfer_engine.benchmark.decode import FUSED


class RandomParams:
    """Parameter source drawing N(0, 1/in) matrices, N(0, 0.1) norms, realistic GDN gates."""

    def __init__(self, config: dict, device: str = "cuda", dtype=torch.bfloat16):
        self.c, self.device, self.dtype = config, device, dtype
        self.fused: dict[str, torch.Tensor] = {}

    def _rows(self, group: str) -> list[int]:
        c, h = self.c, self.c["hidden_size"]
        kg = c["linear_num_key_heads"] * c["linear_key_head_dim"]
        vg = c["linear_num_value_heads"] * c["linear_value_head_dim"]
        qd = c["num_attention_heads"] * c["head_dim"]
        kvd = c["num_key_value_heads"] * c["head_dim"]
        nv, width = c["linear_num_value_heads"], c.get("intermediate_size", h)
        shared = c.get("shared_expert_intermediate_size", 0)
        return {"gdn/": [kg, kg, vg, vg, nv, nv], "attention/": [qd, qd, kvd, kvd],
                "mlp/": [width, width], "moe/shared/": [shared, shared]}[group]

    def __call__(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if "/moe/experts/" in name:
            return self._expert(name)
        for group, members in FUSED.items():
            prefix, _, member = name.rpartition(group)
            if member in members and prefix.startswith("text/layers/"):
                key = prefix + group
                if key not in self.fused:
                    rows = self._rows(group)
                    self.fused[key] = self._matrix((sum(rows), shape[1]))
                rows = self._rows(group)
                start = sum(rows[: members.index(member)])
                return self.fused[key][start : start + shape[0]]
        if name.endswith("a_log"):
            return torch.empty(shape, device=self.device).uniform_(1, 16).log()
        if name.endswith("dt_bias") or len(shape) == 1:
            return torch.randn(shape, device=self.device, dtype=self.dtype) * 0.1
        if name.endswith("convolution"):
            return torch.randn(shape, device=self.device, dtype=self.dtype) * 0.5
        return self._matrix(shape)

    def _expert(self, name):
        """Expert e's gate/up rows of the stacked [E, 2I, H] tensor, or its [H, I] down."""
        prefix, rest = name.split("/moe/experts/")
        e, member = rest.split("/")
        e, width = int(e), self.c["moe_intermediate_size"]
        key = prefix + "/moe/experts/"
        if key + "down" not in self.fused:
            E, h = self.c["num_experts"], self.c["hidden_size"]
            self.fused[key + "gate_up"] = self._matrix((E, 2 * width, h))
            self.fused[key + "down"] = self._matrix((E, h, width))
        if member == "down":
            return self.fused[key + "down"][e]
        start = 0 if member == "gate" else width
        return self.fused[key + "gate_up"][e, start : start + width]

    def _matrix(self, shape):
        return torch.randn(shape, device=self.device, dtype=self.dtype) / math.sqrt(shape[-1])
