"""Component configs the v2 → v3 upgrade hard-codes for the official Qwen files (§3.1, §4.4)."""

from __future__ import annotations

import struct


def f32(value: float) -> float:
    """``value`` rounded to float32 and widened back, as upstream stores config floats."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def text_config(moe: bool) -> dict:
    layers = 40 if moe else 64
    config = {
        "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "hidden_size": 2048 if moe else 5120,
        "vocab_size": 248320,
        "tie_word_embeddings": False,
        "num_hidden_layers": layers,
        "layer_types": [
            "full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)
        ],
        "max_position_embeddings": 262144,
        "rms_norm_eps": f32(1e-6),
        "num_attention_heads": 16 if moe else 24,
        "num_key_value_heads": 2 if moe else 4,
        "head_dim": 256,
        "rope_parameters": {
            "rope_theta": f32(1e7),
            "partial_rotary_factor": f32(0.25),
            "mrope_section": [11, 11, 10],
        },
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_num_value_heads": 32 if moe else 48,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    if moe:
        config.update(
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        )
    else:
        config["intermediate_size"] = 17408
    return config


def vision_config(moe: bool) -> dict:
    return {
        "model_type": "qwen3_5_moe_vision" if moe else "qwen3_5_vision",
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "num_position_embeddings": 2304,
    }


def draft_config(second: bool) -> dict:
    """DFlash (35B drafter) or DFlash2 (3.8-27B drafter)."""
    draft = {
        "target_layer_ids": [5, 19, 33, 47, 61] if second else [1, 6, 11, 16, 22, 27, 32, 37],
        "mask_token_id": 248070 if second else 248077,
    }
    if second:
        draft.update(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16)
    return {
        "architectures": ["DFlash2DraftModel" if second else "DFlashDraftModel"],
        "model_type": "qwen3",
        "intermediate_size": 17408 if second else 6144,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 5 if second else 6,
        "rms_norm_eps": f32(1e-6),
        "rope_parameters": {"rope_theta": f32(1e7)},
        "max_position_embeddings": 262144,
        "layer_types": ["sliding_attention"] * 5 + ([] if second else ["full_attention"]),
        "sliding_window": 2048 if second else 4096,
        "dflash_config": draft,
    }
