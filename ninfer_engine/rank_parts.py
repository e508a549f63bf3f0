"""What one rank of the engine holds on its device: the text model (this rank's share of it
under tensor parallelism), the KV pool and state slots, and the static decode step.

`load_rank` is the load both `Engine` (rank 0) and a tensor-parallel follower
(`parallel.follower`) run, so every rank builds the same pool (page count, slot count) and
captures the same graphs in the same order: the collectives inside them pair up.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .config import EngineConfig
from .memory_plan import auto_kv_capacity, build_memory
from .models import build_model
from .models.experts import check_prefill_scratch, free_device_bytes
from .models.packed import FP8_ACTIVATIONS_KEY
from .parallel import SINGLE, RankGroup, shard_for_rank
from .step.decode_graphs import DecodeGraphs
from .step.families import build_decode_graphs
from .kv import SequenceMemory


@dataclass(frozen=True)
class RankParts:
    model: Any
    memory: SequenceMemory
    graphs: DecodeGraphs | None
    config: EngineConfig  # the resolved `--kv-capacity`
    extra: Any  # what `with_model` built (rank 0: the speculator)


def load_rank(config: EngineConfig, artifact: Any, device: torch.device, dtype: torch.dtype,
              matmul: torch.dtype | None, weights_mode: str, prefill_chunk: int,
              ranks: RankGroup = SINGLE, model: Any = None,
              with_model: Callable[[Any, Any], Any] = lambda model, weights: None,
              expert_tiers: Callable[[dict, Any], Any] | None = None,
              step_weights: Any = None) -> RankParts:
    """Build the rank's model (`model`: one already resident; `expert_tiers`: its routed
    experts beyond the device, `models.build_model`), then `with_model(model, weights)` (the
    rank's weight source: its share under tensor parallelism), then its memory
    sized once the weights are resident, and its decode graphs (`step_weights`: the artifact
    whose stored weights the compiled CPU step reads, `--cpu-step compiled`)."""
    text_config = {**artifact.config("text"),
                   FP8_ACTIVATIONS_KEY: config.prefill_activations == "fp8"}
    if ranks.parallel and (config.expert_vram_mib is not None or config.expert_vram_auto):
        raise ValueError("--expert-vram-mib with --tp above 1 is not built yet")
    if ranks.parallel:  # (rank 0's prefix tree decides; its copies go with the plans)
        text_config, artifact = shard_for_rank(text_config, artifact, ranks, config.tp_experts)
    built = model or build_model(text_config, artifact, device, dtype, matmul, weights_mode,
                                 expert_tiers, ranks)
    extra = with_model(built, artifact)
    # `--kv-capacity auto`: sized now the weights are resident (`kv.sizing`)
    # a drafter's rows kept with the pages (`--spec dflash`, `--spec mtp`) serve only a reused
    # prefix; not under tensor parallelism: rank 0's MTP `forget` would run the head's
    # collectives before the other ranks hear of the end
    rows = (0 if config.no_prefix_reuse or ranks.parallel
            else getattr(extra, "page_rows", 0))
    # a drafter's own attention layer, paged with the model's (`--spec mtp`: the MTP layer)
    drafter_layers = getattr(extra, "kv_layers", 0)
    sized, activations = auto_kv_capacity(config, built, text_config, device, prefill_chunk,
                                          extra, rows, drafter_layers)
    if ranks.parallel and sized.kv_capacity is not None:  # every rank the same pool: the least
        sized = dataclasses.replace(sized, kv_capacity=ranks.least(sized.kv_capacity))
    memory = build_memory(sized, built, prefill_chunk, rows, drafter_layers)
    if activations is None:
        check_prefill_scratch(built, free_device_bytes(device))
    else:  # auto kept its estimate of a chunk's activations free, not ~1 GiB
        check_prefill_scratch(built, free_device_bytes(device), activations)
    graphs = build_decode_graphs(
        built, memory, sized.kv_dtype, sized.max_concurrency, sized.max_context,
        not sized.no_cuda_graph, 1 + (sized.draft_tokens or 0) if sized.spec else 1,
        keep_hidden=sized.spec in ("mtp", "dflash", "dflash2"), weights=step_weights,
        cpu_activations=sized.cpu_activations)
    if graphs is not None and hasattr(extra, "bind_step"):  # `--spec mtp`'s captured round
        extra.bind_step(memory.storage, graphs)
    return RankParts(built, memory, graphs, sized, extra)
