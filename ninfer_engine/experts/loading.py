"""`expert_tiers_for`: the engine's flags → the model's `ExpertTiers`, or None (all resident).

`--expert-vram-mib F` gives the routed experts F MiB of device memory; `auto` the device's
free memory less the other weights (bf16 upper bound), the KV floor (--max-context tokens in
the --kv-dtype) and --vram-headroom-mib (CUDA only: on the CPU reference the "device" is host
memory, so auto keeps every expert resident). One expert's served bytes are measured on the
model's own expert 0, not restated.
"""
from __future__ import annotations

import logging
import math

import torch

from ..artifact.synth import parameter_shapes
from ..config import PAGE_TOKENS, EngineConfig
from ..kv import codecs_for, kv_page_layout
from ..models.experts import free_device_bytes, is_routed_expert, stack_experts
from .placement import GIB, MIB, auto_budget, check_ram_guard, moe_layers, plan_placement
from .tiers import ExpertTiers, expert_name

log = logging.getLogger("ninfer.engine")


def expert_tiers_for(config: EngineConfig, text_config: dict, source, device,
                     dtype: torch.dtype) -> ExpertTiers | None:
    """Tiers for the hybrid MoE model over parameter `source`, when the budget leaves some
    routed experts off the device; None otherwise (and for a dense model)."""
    layers = moe_layers(text_config)
    if not offloading(config, text_config):
        return None
    device = torch.device(device)

    def get(layer, e, member, shape):
        return source(expert_name(layer, e, member), shape)

    expert_bytes = served_expert_bytes(text_config, get)
    if config.expert_vram_auto:
        free = free_device_bytes(device)
        if free is None:
            log.info("--expert-vram-mib auto: no CUDA device, every routed expert resident")
            return None
        budget = auto_budget(free, _other_weight_bytes(text_config),
                             _kv_floor_bytes(config, text_config, dtype),
                             config.vram_headroom_mib * MIB)
    else:
        budget = int(config.expert_vram_mib * MIB)
    placement = plan_placement(text_config, expert_bytes, budget)
    if not placement.offloaded:
        return None
    check_ram_guard(placement.host_bytes)
    log.info("routed experts: %d device slots of %d in each of %d MoE layers (%.2f GiB, "
             "%.0f %% of the experts off the device), every expert in %.2f GiB of %s host "
             "RAM; misses: %s, cache policy %s", placement.slots, placement.experts,
             len(layers), placement.device_bytes / GIB, 100 * placement.host_share,
             placement.host_bytes / GIB, "page-locked" if device.type == "cuda" else "plain",
             config.expert_miss, config.expert_cache)
    return ExpertTiers(text_config, placement, get, device, config.expert_miss,
                       config.expert_cache, config.expert_prefetch, config.expert_cpu_share)


def offloading(config: EngineConfig, text_config: dict) -> bool:
    """Whether the flags ask for a budget; `ValueError` when the model has no routed experts
    (a flag is never silently ignored)."""
    asked = config.expert_vram_mib is not None or config.expert_vram_auto
    if asked and not moe_layers(text_config):
        arch = (text_config.get("architectures") or ["this model"])[0]
        raise ValueError(f"--expert-vram-mib: {arch} has no routed experts")
    return asked


def served_expert_bytes(text_config: dict, get) -> int:
    """Bytes of one routed expert as the device serves it: expert 0 of the first MoE layer
    stacked once through `get(layer, e, member, shape)`."""
    first = moe_layers(text_config)[0]
    probe = stack_experts(lambda e, m, shape: get(first, 0, m, shape), 1,
                          text_config["moe_intermediate_size"], text_config["hidden_size"])
    return sum(s.expert_bytes for s in probe)


def _other_weight_bytes(text_config: dict) -> int:
    """Bytes of every parameter but the routed experts, in bf16 (an upper bound)."""
    return 2 * sum(math.prod(shape) for name, shape in parameter_shapes(text_config).items()
                   if not is_routed_expert(name))


def _kv_floor_bytes(config: EngineConfig, text_config: dict, dtype: torch.dtype) -> int:
    """KV bytes of --max-context tokens (`--spec mtp`: the MTP layer's too, a layer of the
    pool)."""
    attention = text_config["layer_types"].count("full_attention") + (config.spec == "mtp")
    page_bytes, _ = kv_page_layout(attention, text_config["num_key_value_heads"],
                                   text_config["head_dim"], codecs_for(config.kv_dtype, dtype),
                                   PAGE_TOKENS)
    return -(-config.max_context // PAGE_TOKENS) * page_bytes

