"""A tiny hybrid artifact stand-in with a random DFlash (or DFlash2) drafter as its `dflash` (or
`dflash2`) component, the drafter's weights drawn as `ninfer synth --dflash[2] small` draws
them."""
from __future__ import annotations

import torch

from ninfer_engine.artifact import dflash_names
from ninfer_engine.artifact.synth import synthetic_blocks

from .hybrid_helpers import HybridArtifact


def drafter_tensors(config: dict, vocab: int, seed: int = 3) -> dict[str, torch.Tensor]:
    """The logical parameters of a random drafter of `config` (synth's seeded draws)."""
    out = {}
    for name, shape in dflash_names.parameter_shapes(config, vocab).items():
        out[name] = torch.cat(list(synthetic_blocks(name, shape, seed))).reshape(shape)
    return out


class DFlashArtifact(HybridArtifact):
    """A tiny hybrid model's artifact stand-in, with (or without) a random DFlash drafter."""

    def __init__(self, family: str = "qwen3_5", with_dflash: bool = True,
                 config: dict | None = None, dflash2: bool = False) -> None:
        super().__init__(family)
        self.components = {"text": {"config": self._config}}
        if with_dflash:
            self.drafter_config = config or dflash_names.synth_config(self._config, False,
                                                                      dflash2)
            self._tensors.update(drafter_tensors(self.drafter_config,
                                                 self._config["vocab_size"]))
            self.components[dflash_names.backend(self.drafter_config)] = (
                dflash_names.component(self.drafter_config))
