"""Tensor parallelism over torch.distributed: the rank group and its collectives (`group`),
each rank's share of the weights (`shard`), and the engine's ranks in lockstep (`lockstep`)."""
from .group import SINGLE, RankGroup, join_from_env, leave
from .shard import EXPERT_SHARDING, shard_for_rank

__all__ = ["EXPERT_SHARDING", "SINGLE", "RankGroup", "join_from_env", "leave", "shard_for_rank"]
