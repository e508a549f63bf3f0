"""A dict-backed artifact stand-in for the hybrid family, built from tiny seeded HF models."""
from __future__ import annotations

import torch

from ninfer_engine.artifact.hf_names import logical_params_from_hf, text_config_from_hf
from tests.models.qwen35_tiny import hf_model

from .helpers import FakeArtifact, default_resources


class HybridArtifact(FakeArtifact):
    """Logical parameters of a tiny Qwen3.5-family HF model, with `FakeArtifact`'s resources."""

    def __init__(self, family: str = "qwen3_5", seed: int = 0, config=None) -> None:
        self.hf = hf_model(family, seed, config)  # `config`: another HF config of the family
        self.name = f"tiny-{family}"
        self._config = text_config_from_hf(self.hf.config)
        self._tensors = logical_params_from_hf(self.hf.state_dict(), self._config)
        self._resources = default_resources()

    def has_parameter(self, name: str) -> bool:
        return name in self._tensors

    def parameter(self, name, shape, dtype=torch.float32):
        tensor = self._tensors[name]
        assert tuple(tensor.shape) == tuple(shape), (name, tensor.shape, shape)
        return tensor.to(dtype)


def hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:
    """HF's own greedy loop with its cache (prefill in one forward, then one token per step)."""
    with torch.inference_mode():
        out = hf(torch.tensor([prompt]), use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(steps - 1):
            out = hf(torch.tensor([[tokens[-1]]]), cache=out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens
