"""Model families by architecture name, built from an artifact's text config and weights."""
from __future__ import annotations

import torch

from ..parallel.group import SINGLE, RankGroup
from .attention import Segment
from .experts import bf16_fits, free_device_bytes, is_routed_expert, load_expert
from .fused import FusedParams
from .kv_cache import ContiguousKvCache
from .llama import LlamaConfig, LlamaModel, WeightSource
from .packed import PackedMatrix, is_projection, load_projection
from .qwen3_5 import Qwen35Model

_LLAMA_FAMILY = {"LlamaForCausalLM", "Qwen3ForCausalLM"}
_HYBRID_FAMILY = {"Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"}


def build_model(text_config: dict, weights: WeightSource, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32,
                matmul_dtype: torch.dtype | None = None,
                weights_mode: str = "dequant", expert_tiers=None,
                ranks: RankGroup = SINGLE) -> LlamaModel | Qwen35Model:
    """Instantiate the engine family for `text_config["architectures"][0]`; `matmul_dtype`
    (`--cpu-matmul`) gives each projection and the head a narrower copy (bf16, or int8 rows)
    that few-row (decode) calls multiply by, both families (`layers.Linear`; the hybrid family
    on the CPU only: on CUDA it decodes over `FusedParams` with its own kernels);
    `weights_mode` is `--cuda-weights` (`load_projection`; routed experts: `load_expert`);
    `expert_tiers(text_config, source)`: the hybrid MoE model's offloaded routed experts
    (`ninfer_engine.experts.ExpertTiers`) or None, built over the parameter source.
    `ranks`: tensor parallelism, `text_config` and `weights` then this rank's share
    (`parallel.shard.shard_for_rank`)."""
    architectures = text_config.get("architectures") or [text_config.get("model_type", "?")]
    arch = architectures[0]
    if arch in _LLAMA_FAMILY:
        return LlamaModel(LlamaConfig.from_text_config(text_config), weights, device, dtype,
                          matmul_dtype, weights_mode, ranks)
    if arch in _HYBRID_FAMILY:
        # Q4/Q5 routed experts stay bf16 under auto only if the bf16-expert model fits
        fits = weights_mode != "auto" or "num_experts" not in text_config or bf16_fits(
            text_config, free_device_bytes(device))

        # the hybrid model reads tensors through a (name, shape) source
        def source(name, shape):
            kept = None
            if is_projection(name):
                kept = load_projection(weights, name, shape, device, dtype, weights_mode)
            elif is_routed_expert(name):  # fp8 where `experts.expert_form` says so
                kept = load_expert(weights, name, shape, device, weights_mode, fits)
            if kept is not None:
                return kept
            return weights.parameter(name, shape).to(device, dtype)

        tiers = expert_tiers(text_config, source) if expert_tiers is not None else None
        if tiers is not None:  # routed experts in the tiers: the model holds placeholders
            source = tiers.placeholders(source)
        if torch.device(device).type == "cuda":  # fused decode GEMV groups for the kernels
            model = Qwen35Model(text_config, FusedParams(text_config, source, tiers),
                                ranks=ranks)
        else:
            model = Qwen35Model(text_config, source, matmul_dtype, ranks)
        if tiers is not None:
            tiers.install(model)
        return model
    raise NotImplementedError(f"architecture {arch!r} is not supported by this engine")


__all__ = ["ContiguousKvCache", "LlamaConfig", "LlamaModel", "Qwen35Model", "Segment",
           "PackedMatrix", "WeightSource", "build_model", "is_projection", "load_projection"]
