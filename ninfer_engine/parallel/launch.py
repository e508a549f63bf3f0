"""`--tp N --devices A,B,..`: one process per rank, rank 0 this one.

Ranks 1..N-1 are spawned processes (`follower.follower_main`) on their devices; this process
joins the group as rank 0 on the first device and builds the `Engine` that serves. The
rendezvous is torch.distributed's env:// on 127.0.0.1 and a free port: one host. Across hosts
the same code joins a group named by `MASTER_ADDR`/`MASTER_PORT`/`RANK`/`WORLD_SIZE`
(`group.join_from_env`); the spawning here is the one-host launcher.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
from multiprocessing.connection import wait

import torch.multiprocessing as mp

from ..config import EngineConfig
from ..engine import Engine
from ..serving import serving_device
from .follower import follower_main
from .group import join_from_env, leave


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensor_parallel_engine(config: EngineConfig) -> Engine:
    """Spawn the other ranks, join as rank 0 and load the serving engine on `devices[0]`.
    A rank that fails to load fails the group's first collective: a startup error."""
    leave()  # a reload: the previous engine's group is gone with its followers
    world, port = config.tp, _free_port()
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    followers = []
    for rank in range(1, world):
        # daemonic: the followers end with this process, whatever ends it
        followers.append(ctx.Process(target=follower_main, daemon=True, name=f"rank {rank}",
                                     args=(dataclasses.replace(config, device=config.devices[rank]),
                                           rank, world, port)))
        followers[-1].start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE=str(world))
    config = dataclasses.replace(config, device=config.devices[0])
    engine = Engine(config, ranks=join_from_env(serving_device(config)))
    threading.Thread(target=_watch, args=(engine, followers), daemon=True,
                     name="ninfer-rank-watch").start()
    return engine


def _watch(engine: Engine, followers: list) -> None:
    """The first follower to exit fails the engine (after a stop that is a no-op)."""
    ended = wait([p.sentinel for p in followers])
    gone = next(p for p in followers if p.sentinel in ended)
    gone.join()
    engine.rank_failed(f"tensor-parallel {gone.name} exited with status {gone.exitcode}")
