"""A tensor-parallel rank's collectives over torch.distributed (NCCL on CUDA, gloo on CPUs).

`RankGroup` is what a model layer sees of tensor parallelism: `all_reduce` (the sum of the
ranks' partial outputs after each attention/GDN output and each MLP/MoE down projection),
`vocab_rows` / `gather_vocab` (the vocab-parallel head) and, for the engine's lockstep,
`broadcast` of one step's plan from rank 0. `SINGLE` is tensor parallelism off: every call is
the identity, so a model built without a group runs exactly as before.

The group comes from torch.distributed's env rendezvous (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
`WORLD_SIZE`), the way torch.distributed scales past one host; nothing here assumes two ranks.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# a step's collective that waits longer than this fails the rank (a peer hung)
DEFAULT_TIMEOUT_S = 30.0
# a follower waits this long for rank 0's next plan: rank 0 may still be loading (the payload
# digest of a 50 GB artifact) or capturing graphs; a peer that died breaks the wait at once
CONTROL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class RankGroup:
    """This process's place in the tensor-parallel group (world 1: no group)."""

    rank: int = 0
    world: int = 1
    # the CPU (gloo) group the step plans go through, off the device's stream (NCCL would make
    # each plan a device sync); None: the default group
    control: Any = field(default=None, compare=False, repr=False)

    @property
    def parallel(self) -> bool:
        return self.world > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `x` over the ranks, in place."""
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def shard(self, n: int, what: str) -> tuple[int, int]:
        """This rank's [start, end) of `n` units split evenly (heads, columns, experts)."""
        if n % self.world:
            raise ValueError(f"tensor parallelism over {self.world} ranks needs {what} "
                             f"divisible by {self.world}, got {n}")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def vocab_rows(self, vocab: int) -> tuple[int, int]:
        """This rank's rows of the head: ceil(vocab / world) each, the last rank fewer."""
        per = -(-vocab // self.world)
        return min(self.rank * per, vocab), min((self.rank + 1) * per, vocab)

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """[T, local vocab] on every rank -> [T, vocab] on every rank (rows in rank order)."""
        if self.world == 1:
            return logits
        per = -(-vocab // self.world)
        padded = logits.new_full((logits.shape[0], per), float("-inf"))
        padded[:, : logits.shape[1]] = logits
        out = logits.new_empty((self.world, logits.shape[0], per))  # rank-major blocks
        dist.all_gather(list(out.unbind(0)), padded)  # in place: each block is contiguous
        return out.permute(1, 0, 2).reshape(-1, self.world * per)[:, :vocab]

    def broadcast_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` in every rank's `x` (same shape and dtype), on the step's group: a
        device copy with NCCL, where the control group would pickle it through the host."""
        if self.world > 1:
            dist.broadcast(x, src=0)
        return x

    def least(self, value: int) -> int:
        """The smallest of the ranks' `value`s (what every rank can hold)."""
        if self.world == 1:
            return value
        box = torch.tensor([value], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            box = box.cuda()
        dist.all_reduce(box, op=dist.ReduceOp.MIN)
        return int(box.item())

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0's `message` on every rank (a step's plan: small Python objects)."""
        if self.world == 1:
            return message
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]


SINGLE = RankGroup()


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


_JOINED: list[RankGroup] = []  # the group this process is in (creating groups is collective)


def join_from_env(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> RankGroup:
    """Join the group named by the environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    `MASTER_PORT`); world 1 without `WORLD_SIZE`. Joined already: that group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SINGLE
    if _JOINED:
        return _JOINED[0]
    if not dist.is_initialized():
        kwargs = {}
        if device.type == "cuda":  # NCCL binds the rank to its device
            torch.cuda.set_device(device)
            kwargs = {"device_id": device}
        dist.init_process_group(backend_for(device), init_method="env://",
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=CONTROL_TIMEOUT_S))
    _JOINED.append(RankGroup(dist.get_rank(), dist.get_world_size(), control))
    return _JOINED[0]


def leave() -> None:
    """Destroy the process group, if one was joined."""
    _JOINED.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
