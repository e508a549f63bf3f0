"""Tiny seeded HF Qwen3.5 / Qwen3.5-MoE / Qwen3-Next models (model-math.md §7) and our twins."""

from __future__ import annotations

import torch

from ninfer_engine.models.hf_names import logical_params_from_hf, text_config_from_hf
from ninfer_engine.models.qwen3_5 import Qwen35Model, dict_params

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3_next_mixed")

_COMMON = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=16,
)
_ROPE = dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25)
_MROPE = dict(_ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True)
_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
            shared_expert_intermediate_size=40)


def hf_config(family: str):
    """The HF text config of one tiny family (dense is tied, like Qwen3.5-0.8B)."""
    if family == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5TextConfig

        return Qwen3_5TextConfig(**_COMMON, intermediate_size=96, rope_parameters=_MROPE,
                                 tie_word_embeddings=True)
    if family == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig(**_COMMON, **_MOE, rope_parameters=_MROPE)
    from transformers.models.qwen3_next import Qwen3NextConfig

    # "mixed": layer 1 (a GDN layer) has a dense MLP instead of the MoE
    extra = dict(mlp_only_layers=[1]) if family == "qwen3_next_mixed" else {}
    return Qwen3NextConfig(**_COMMON, **_MOE, norm_topk_prob=True, intermediate_size=96,
                           rope_parameters=_ROPE, **extra)


def hf_model(family: str, seed: int = 0):
    """The seeded fp32 eager HF model with every parameter (1-D ones included) randomised."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_next import Qwen3NextForCausalLM

    cls = {"qwen3_5": Qwen3_5ForCausalLM, "qwen3_5_moe": Qwen3_5MoeForCausalLM}.get(
        family, Qwen3NextForCausalLM
    )
    torch.manual_seed(seed)
    model = cls._from_config(hf_config(family), attn_implementation="eager",
                             dtype=torch.float32, experts_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=gen).log())
            elif p.dim() == 1:
                p.copy_(torch.empty(p.shape).uniform_(-0.5, 0.5, generator=gen))
            elif "embed_tokens" in name:
                # small, so the tied dense head does not just repeat the input token
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
            else:
                # O(1) activations so logits and routing are far from uniform
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model.eval()


def ours(model, device: torch.device | str = "cpu") -> Qwen35Model:
    """Our model on `device` over the HF model's weights mapped through hf_names."""
    config = text_config_from_hf(model.config)
    tensors = logical_params_from_hf(model.state_dict(), config)
    return Qwen35Model(config, dict_params({k: t.to(device) for k, t in tensors.items()}))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, on b's device (our model's output against a CPU reference)."""
    return ((a.to(b.device) - b).abs().max() / b.abs().max()).item()
