"""One rank's share of the weights, cut at load from the artifact (Megatron-style sharding).

`shard_for_rank(text_config, weights, ranks, experts)` gives the rank's text config (head,
intermediate and expert counts divided by the world size; the model code reads its shapes from
it unchanged) and a weight source that hands each layer only its rows or columns:

- attention and GDN by heads: q/gate/k/v and the GDN q/k/v/z/a/b rows, `a_log`, `dt_bias` and
  the GDN convolution's q|k|v channels of the rank's heads; the output projection's columns;
- dense MLP and the shared expert by intermediate: gate/up rows, down columns;
- routed experts by expert id (`experts="expert"`: the rank builds only its experts; the router
  stays whole) or by intermediate (`experts="intermediate"`: every expert, a slice of each);
- the MTP head's layer (`mtp/layers/0/...`) like a text layer; its norms and input projection
  whole;
- norms, router, shared-expert score and the embedding whole; the head is cut by the model
  (`RankGroup.vocab_rows`), which gathers the logits (the MTP head drafts through it too).

Each layer's output then is a partial sum, which the model all-reduces (`RankGroup.all_reduce`).
Projections stored packed (fp8, Q4..Q8 rows) keep their packed form where the cut is whole rows
(`row_parts`); a column cut of a packed projection is decoded to the model's dtype instead.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from .group import RankGroup

EXPERT_SHARDING = ("expert", "intermediate")
# the config fields a rank divides by the world size (those present in the config)
_DIVIDED = ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
            "linear_num_value_heads", "intermediate_size", "shared_expert_intermediate_size")
_ROWS = {"attention/query", "attention/gate", "attention/key", "attention/value",
         "gdn/query", "gdn/key", "gdn/value", "gdn/z", "gdn/a_projection", "gdn/b_projection",
         "gdn/a_log", "gdn/dt_bias", "mlp/gate", "mlp/up", "moe/shared/gate", "moe/shared/up"}
_COLUMNS = {"attention/output", "gdn/output", "mlp/down", "moe/shared/down"}
# the text layers and the MTP head's layer are cut alike
_LAYER = re.compile(r"^(?:text|mtp)/layers/\d+/(.+)$")
_EXPERT = re.compile(r"^moe/experts/\d+/(gate|up|down)$")


def shard_for_rank(text_config: dict, weights: Any, ranks: RankGroup,
                   experts: str = "intermediate") -> tuple[dict, Any]:
    """(the rank's text config, its weight source); the identity at world 1."""
    if not ranks.parallel:
        return text_config, weights
    return rank_config(text_config, ranks, experts), ShardedWeights(weights, text_config,
                                                                    ranks, experts)


def rank_config(config: dict, ranks: RankGroup, experts: str = "intermediate") -> dict:
    """`config` with the counts one rank holds; `tp_local_experts` [start, end) under expert
    sharding. A count the world size does not divide is a clear error."""
    if experts not in EXPERT_SHARDING:
        raise ValueError(f"expert sharding {experts!r} is not one of {EXPERT_SHARDING}")
    out = dict(config)
    heads = config["num_attention_heads"]
    out["head_dim"] = config.get("head_dim") or config["hidden_size"] // heads
    for field in _DIVIDED:
        if field in config:
            start, end = ranks.shard(config[field], field)
            out[field] = end - start
    if "num_experts" in config:
        if experts == "expert":
            out["tp_local_experts"] = list(ranks.shard(config["num_experts"], "num_experts"))
        else:
            start, end = ranks.shard(config["moe_intermediate_size"], "moe_intermediate_size")
            out["moe_intermediate_size"] = end - start
    return out


class ShardedWeights:
    """A weight source (`parameter`, `has_parameter`, `row_parts`) that cuts each sharded
    tensor to this rank's part; everything else passes through whole."""

    def __init__(self, weights: Any, config: dict, ranks: RankGroup, experts: str) -> None:
        self.weights, self.ranks = weights, ranks
        self.expert_rows = experts == "intermediate"
        if "linear_num_key_heads" in config:
            kg = config["linear_num_key_heads"] * config["linear_key_head_dim"]
            vg = config["linear_num_value_heads"] * config["linear_value_head_dim"]
            self.conv_channels = (kg, kg, vg)  # the convolution's q | k | v channel groups

    def __getattr__(self, name: str) -> Any:  # resources, configs, name, ... of the artifact
        return getattr(self.weights, name)

    def has_parameter(self, name: str) -> bool:
        return self.weights.has_parameter(name)

    def _cut(self, name: str) -> tuple[int, tuple[int, ...] | None] | None:
        """(dimension, its segments in the full tensor, None = one) that `name` is cut along,
        or None for a tensor every rank holds whole."""
        match = _LAYER.match(name)
        if match is None:
            return None
        leaf = match.group(1)
        expert = _EXPERT.match(leaf)
        if expert is not None:
            if not self.expert_rows:
                return None  # by expert id: the rank asks only for its own experts
            return (1, None) if expert.group(1) == "down" else (0, None)
        if leaf == "gdn/convolution":
            return 1, self.conv_channels
        if leaf in _ROWS:
            return 0, None
        if leaf in _COLUMNS:
            return 1, None
        return None

    def _ranges(self, size: int, segments: tuple[int, ...] | None) -> list[tuple[int, int]]:
        """This rank's [start, end) ranges of a dimension of `size` cut segment by segment."""
        ranges, offset = [], 0
        for segment in segments or (size,):
            start, end = self.ranks.shard(segment, "a sharded dimension")
            ranges.append((offset + start, offset + end))
            offset += segment
        return ranges

    def _full_shape(self, shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
        full = list(shape)
        full[dim] *= self.ranks.world
        return tuple(full)

    def parameter(self, name: str, shape: tuple[int, ...],
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
        cut = self._cut(name)
        if cut is None:
            return self.weights.parameter(name, shape, dtype)
        dim, segments = cut
        full = self.weights.parameter(name, self._full_shape(tuple(shape), dim), dtype)
        parts = [full.narrow(dim, start, end - start)
                 for start, end in self._ranges(full.shape[dim], segments)]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim)).contiguous()

    def row_parts(self, name: str, shape: tuple[int, ...]) -> list | None:
        """The packed-weight parts of the rank's rows (see `Artifact.row_parts`); None for a
        column cut, which `parameter` decodes instead."""
        row_parts = getattr(self.weights, "row_parts", None)
        if row_parts is None:
            return None
        cut = self._cut(name)
        if cut is None:
            return row_parts(name, shape)
        dim, segments = cut
        if dim != 0 or len(shape) != 2:
            return None
        parts = row_parts(name, self._full_shape(tuple(shape), 0))
        if parts is None:
            return None
        (want_start, want_end), = self._ranges(shape[0] * self.ranks.world, segments)
        out, row = [], 0
        for fmt, obj_shape, r0, r1, raw in parts:  # rows [row, row + r1 - r0) of the tensor
            start, end = max(want_start, row), min(want_end, row + r1 - r0)
            if start < end:
                out.append((fmt, obj_shape, r0 + start - row, r0 + end - row, raw))
            row += r1 - r0
        return out
