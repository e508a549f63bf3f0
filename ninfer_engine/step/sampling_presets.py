"""Request defaults before request fields: the model preset, then the process flags.

The Qwen3.5-family presets of http-contract §11 depend on the thinking mode, so the engine
resolves both variants once at load; other models take `generation_config.json`, else the
neutral sampler (T 1.0, top-p 1.0, top-k off, min-p 0, no penalties).

The default output limit (a request without `max_tokens`) is `--default-max-tokens` when the
operator gives it, else `generation_config.json`'s `max_new_tokens` (HF's key; `ninfer convert
gguf --generation max_new_tokens=N` records it), else `DEFAULT_MAX_TOKENS`.
"""
from __future__ import annotations

import json
from typing import Any

from ..config import DEFAULT_MAX_TOKENS, EngineConfig
from ..types import SamplingParams

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


# generation_config.json keys the sampler takes as they are (presence/frequency penalties are
# OpenAI's additive ones; HF's multiplicative `repetition_penalty` is not one of them)
_PRESET_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                "frequency_penalty")


def generation_config(artifact: Any) -> dict[str, Any]:
    """The artifact's `generation_config.json`, or {} without one."""
    if not artifact.has_resource("generation_config.json"):
        return {}
    return json.loads(artifact.resource("generation_config.json"))


def generation_config_preset(artifact: Any) -> dict[str, Any]:
    config = generation_config(artifact)
    preset = {k: config[k] for k in _PRESET_KEYS if config.get(k) is not None}
    if config.get("do_sample") is False:
        preset["temperature"] = 0.0
    return preset


def default_max_tokens(artifact: Any, config: EngineConfig) -> int:
    """Output limit of a request without one: `--default-max-tokens` when given, else the
    artifact's `max_new_tokens`, else `DEFAULT_MAX_TOKENS`."""
    if config.default_max_tokens is not None:
        return config.default_max_tokens
    value = generation_config(artifact).get("max_new_tokens")
    # bool is an int to Python; a bad value in a hand-made file falls back to the built-in
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return DEFAULT_MAX_TOKENS


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
