"""Model families by architecture name, built from an artifact's text config and weights."""
from __future__ import annotations

import torch

from .attention import Segment
from .kv_cache import ContiguousKvCache
from .llama import LlamaConfig, LlamaModel, WeightSource

_LLAMA_FAMILY = {"LlamaForCausalLM", "Qwen3ForCausalLM"}


def build_model(text_config: dict, weights: WeightSource, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> LlamaModel:
    """Instantiate the engine family for `text_config["architectures"][0]`."""
    architectures = text_config.get("architectures") or [text_config.get("model_type", "?")]
    arch = architectures[0]
    if arch in _LLAMA_FAMILY:
        return LlamaModel(LlamaConfig.from_text_config(text_config), weights, device, dtype)
    raise NotImplementedError(f"architecture {arch!r} is not supported by this engine")


__all__ = ["ContiguousKvCache", "LlamaConfig", "LlamaModel", "Segment", "WeightSource",
           "build_model"]
