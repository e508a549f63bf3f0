"""How the supervisor builds an engine for a config: `EngineFactory` and the default one.

Tensor parallelism gets one process per rank (`parallel.launch`); otherwise the engine runs in a
process of its own (`engine_process`) or in this one, by `_in_own_process`.
"""
from __future__ import annotations

import os
from typing import Callable

from .config import EngineConfig

EngineFactory = Callable[[EngineConfig], object]


def _default_factory(config: EngineConfig):
    if config.tp > 1:  # one process per rank (`parallel.launch`)
        from .parallel.launch import tensor_parallel_engine

        return tensor_parallel_engine(config)
    if _in_own_process(config):
        from .engine_process import EngineProcess

        return EngineProcess(config)
    from .engine import Engine  # torch is imported only when an engine is really built

    return Engine(config)


def _in_own_process(config: EngineConfig) -> bool:
    """The engine in a process of its own (`engine_process`) where a step's host work limits
    serving: on CUDA, or as `NINFER_ENGINE_PROCESS=0|1` says. The CPU engine stays in this one
    by default (its step needs every core)."""
    chosen = os.environ.get("NINFER_ENGINE_PROCESS", "")
    if chosen:
        return chosen.lower() in ("1", "true", "on")
    if config.engine_process is not None:
        return config.engine_process
    import torch

    return torch.cuda.is_available()
