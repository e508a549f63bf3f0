"""SwiGLU MLP and the sparse MoE FFN of Qwen3-Next / Qwen3.5-MoE (model-math.md §2.3, §2.4).

Torch reference path over [T, H] activations.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

ParamSource = Callable[[str, tuple[int, ...]], torch.Tensor]


class SwiGLU:
    """`down(SiLU(gate·h) ⊙ up·h)` bound to `{prefix}{gate,up,down}`."""

    def __init__(self, params: ParamSource, prefix: str, hidden: int, width: int):
        self.gate = params(prefix + "gate", (width, hidden))
        self.up = params(prefix + "up", (width, hidden))
        self.down = params(prefix + "down", (hidden, width))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down)


class SparseMoE:
    """Softmax-over-all-experts top-k routing, SwiGLU experts, sigmoid-gated shared expert.

    Bound to `{prefix}moe/{router, shared_score, experts/e/*, shared/*}`. No capacity limit.
    """

    def __init__(self, config: dict, params: ParamSource, prefix: str):
        h = config["hidden_size"]
        self.n_experts = config["num_experts"]
        self.top_k = config["num_experts_per_tok"]
        self.renormalise = config.get("norm_topk_prob", True)
        p = prefix + "moe/"
        self.router = params(p + "router", (self.n_experts, h))
        self.shared_score = params(p + "shared_score", (1, h))
        width = config["moe_intermediate_size"]
        self.experts = [
            SwiGLU(params, f"{p}experts/{e}/", h, width) for e in range(self.n_experts)
        ]
        self.shared = SwiGLU(params, p + "shared/", h, config["shared_expert_intermediate_size"])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k (weights [T, k] in x's dtype, expert ids [T, k]); softmax in fp32 over all E."""
        probs = torch.softmax(F.linear(x, self.router), -1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, -1)
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            rows, slot = torch.where(ids == e)
            y = self.experts[e](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        shared = torch.sigmoid(F.linear(x, self.shared_score)) * self.shared(x)
        return out + shared
