"""A tiny seeded MTP head for the tiny HF Qwen3.5 families, built from transformers' own blocks
(HF has no MTP module: model-math.md §7 "MTP reference from HF blocks"), its checkpoint
tensors (`mtp.*` names without the prefix), and the float64 reference forward of §3.1."""
from __future__ import annotations

import copy

import torch

from .qwen35_tiny import hf_config, hf_model


class HfMtp:
    """`fc`, the two pre-fc norms and a one-layer full-attention HF model of the family, whose
    layer 0 is the MTP layer and whose final norm is `mtp.norm`."""

    def __init__(self, family: str, seed: int = 1) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

        config = hf_config(family)
        config.num_hidden_layers, config.layer_types = 1, ["full_attention"]
        self.inner = hf_model(family, seed, config)
        h, eps = config.hidden_size, config.rms_norm_eps
        gen = torch.Generator().manual_seed(seed + 1000)
        self.fc = torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5
        self.norm_embedding, self.norm_hidden = Qwen3_5RMSNorm(h, eps), Qwen3_5RMSNorm(h, eps)
        with torch.no_grad():
            for norm in (self.norm_embedding, self.norm_hidden):
                norm.weight.copy_(torch.empty(h).uniform_(-0.5, 0.5, generator=gen))

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """The head as a checkpoint's `mtp.*` tensors (names without `mtp.`)."""
        state = self.inner.state_dict()
        out = {k.removeprefix("model."): v for k, v in state.items()
               if k.startswith("model.layers.0.")}
        out["norm.weight"] = state["model.norm.weight"]
        out["fc.weight"] = self.fc
        out["pre_fc_norm_embedding.weight"] = self.norm_embedding.weight.detach()
        out["pre_fc_norm_hidden.weight"] = self.norm_hidden.weight.detach()
        return out

    @torch.no_grad()
    def reference(self, target_hf, tokens: torch.Tensor, hidden: torch.Tensor,
                  positions: torch.Tensor, media=None) -> torch.Tensor:
        """ĥ of §3.1 in float64 for one sequence's pairs (token x_{t+1}, target hidden h_t at
        position t: [T], or [3, T] MRoPE), all at once under the causal mask: the output at
        each pair; `media`: (pair rows, vision rows) replacing those pairs' embeddings."""
        inner = copy.deepcopy(self.inner).double()  # .double() converts a module in place
        embed = target_hf.get_input_embeddings().weight.double()[tokens]
        if media is not None:
            embed[media[0]] = media[1].double()
        e = copy.deepcopy(self.norm_embedding).double()(embed)
        h = copy.deepcopy(self.norm_hidden).double()(hidden.double())
        u = torch.cat([e, h], -1) @ self.fc.double().t()
        ids = positions[None] if positions.dim() == 1 else positions[:, None]  # [3, 1, T]
        out = inner.model(inputs_embeds=u[None], position_ids=ids, use_cache=False)
        return out.last_hidden_state[0]
