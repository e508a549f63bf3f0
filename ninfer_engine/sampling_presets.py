"""Sampler defaults before request fields: the model preset, then the process flags.

The Qwen3.5-family presets of http-contract §11 depend on the thinking mode, so the engine
resolves both variants once at load; other models take `generation_config.json`, else the
neutral sampler (T 1.0, top-p 1.0, top-k off, min-p 0, no penalties).
"""
from __future__ import annotations

import json
from typing import Any

from .config import EngineConfig
from .types import SamplingParams

_SAMPLER_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "seed")
# (thinking, non-thinking) presets: temperature, top_p, top_k, min_p, presence_penalty
_QWEN_27B = ((1.0, 0.95, 20, 0.0, 0.0), (0.7, 0.80, 20, 0.0, 1.5))
_QWEN_35B_A3B = ((1.0, 0.95, 20, 0.0, 1.5), (0.7, 0.80, 20, 0.0, 1.5))


def qwen_preset(text_config: dict, thinking: bool) -> dict[str, Any] | None:
    """The contract's preset for the 27B and 35B-A3B shapes, else None."""
    arch = (text_config.get("architectures") or [""])[0]
    if arch == "Qwen3_5ForCausalLM" and text_config.get("hidden_size") == 5120:
        table = _QWEN_27B
    elif arch == "Qwen3_5MoeForCausalLM" and text_config.get("num_experts") == 256:
        table = _QWEN_35B_A3B
    else:
        return None
    values = table[0] if thinking else table[1]
    return dict(zip(("temperature", "top_p", "top_k", "min_p", "presence_penalty"), values))


def generation_config_preset(artifact: Any) -> dict[str, Any]:
    if not artifact.has_resource("generation_config.json"):
        return {}
    config = json.loads(artifact.resource("generation_config.json"))
    preset = {k: config[k] for k in ("temperature", "top_p", "top_k", "min_p")
              if config.get(k) is not None}
    if config.get("do_sample") is False:
        preset["temperature"] = 0.0
    return preset


def sampling_defaults(artifact: Any, config: EngineConfig, thinking: bool) -> SamplingParams:
    """Model preset (Qwen table, else generation_config.json), then the process flags."""
    text_config = artifact.config("text")
    values = qwen_preset(text_config, thinking) or generation_config_preset(artifact)
    for key in _SAMPLER_KEYS:
        if getattr(config, key) is not None:
            values[key] = getattr(config, key)
    if config.greedy:
        values["temperature"] = 0.0
    return SamplingParams(**values)
