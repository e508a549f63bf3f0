"""Tiny seeded HF Qwen3.5 / Qwen3.5-MoE / Qwen3-Next models (model-math.md §7) and our twins."""

from __future__ import annotations

import torch

from ninfer_engine.artifact.hf_names import logical_params_from_hf, text_config_from_hf
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


def hf_model(family: str, seed: int = 0, config=None):
    """The seeded fp32 eager HF model with every parameter (1-D ones included) randomised
    (`config`: another HF text config of the family than `hf_config(family)`)."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_next import Qwen3NextForCausalLM

    cls = {"qwen3_5": Qwen3_5ForCausalLM, "qwen3_5_moe": Qwen3_5MoeForCausalLM}.get(
        family, Qwen3NextForCausalLM
    )
    torch.manual_seed(seed)
    model = cls._from_config(config or hf_config(family), attn_implementation="eager",
                             dtype=torch.float32, experts_implementation="eager")
    return randomize(model, seed, lambda p: p.shape[-1])


def randomize(model, seed: int, fan_in):
    """Every parameter of `model` (1-D ones included) drawn from a seeded generator: A_log in
    log(0.01..16), 1-D in ±0.5, embeddings × 0.25, matrices N(0, 1/fan_in(p))."""
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
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in(p) ** 0.5)
    return model.eval()


def ours(model, device: torch.device | str = "cpu") -> Qwen35Model:
    """Our model on `device` over the HF model's weights mapped through hf_names."""
    config = text_config_from_hf(model.config)
    tensors = logical_params_from_hf(model.state_dict(), config)
    return Qwen35Model(config, dict_params({k: t.to(device) for k, t in tensors.items()}))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, on b's device (our model's output against a CPU reference)."""
    return ((a.to(b.device) - b).abs().max() / b.abs().max()).item()


def hybrid_depth(config: dict, context: int, first_layer: int = 0,
                 gates: torch.Tensor | None = None) -> float:
    """fp32 roundings (`tests.tolerance`) of a Qwen3.5-family forward's longest chain to the
    logits, from `first_layer` on (earlier layers computed by identical ops on identical inputs
    give identical bits). Per layer: the RMSNorm (H); a GDN mixer's projections (H), conv taps
    (4) and SiLU, the l2 norms and the gated delta rule over `context` tokens, carried as
    `recurrence_length(gates)` tokens (no decay — every token carried — without `gates`), the
    gated norm (dv) and the output projection (nv·dv); an attention mixer's projections (H), q/k
    norms (D), RoPE, scores (D·√D: ‖q‖‖k‖/√D ≤ √D·max|1 + w| for RMS-normed q, k, as the exp
    turns their absolute error relative), the softmax sum and P·V (2 × context), the output
    gate and projection (nq·D); the residual; the RMSNorm (H); the MLP (H + I) or the experts
    (the router's H and softmax over E, H + I of each expert, the k-slot sum, the shared
    expert); the residual. Then the final norm and the head (2H)."""
    from tests.tolerance import TRANSCENDENTAL, gated_delta_depth

    H, D, nq = config["hidden_size"], config["head_dim"], config["num_attention_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    nv = config["linear_num_value_heads"]
    if config.get("num_experts"):
        inter = config["moe_intermediate_size"]
        mlp = H + config["num_experts"] + TRANSCENDENTAL + H + inter + config[
            "num_experts_per_tok"] + 1 + H + (config.get("shared_expert_intermediate_size") or 0)
    else:
        mlp = H + config["intermediate_size"]
    g = torch.zeros(context, 1) if gates is None else gates
    depth = 0.0
    for kind in config["layer_types"][first_layer:]:
        if kind == "linear_attention":
            mixer = (H + 4 + TRANSCENDENTAL + 2 + gated_delta_depth(g, dk, normalize=True)
                     + dv + TRANSCENDENTAL + nv * dv)
        else:
            mixer = (H + D + TRANSCENDENTAL + 4 + D * D ** 0.5 * 1.5 ** 2 + 2 * context
                     + TRANSCENDENTAL + 3 + nq * D)
        depth += H + mixer + 1 + H + mlp + 2 * TRANSCENDENTAL + 1
    return depth + 2 * H
