"""HF ↔ ninfer logical names for the qwen3_5 / qwen3_5_moe / qwen3_next text models.

`text_config_from_hf` normalises a HF text config to the ninfer-format.md §3.1 dict;
`logical_params_from_hf` turns a HF text `state_dict` (or checkpoint tensors) into the §3.2
logical-name dict, applying the documented layout transforms:
- `q_proj` per-head `[query | gate]` interleave undone into `attention/{query,gate}`;
- `conv1d.weight` [C, 1, K] -> tap-major `gdn/convolution` [K, C];
- Qwen3-Next `in_proj_qkvz` / `in_proj_ba` per-key-head groups re-sliced into the Qwen3.5 layout;
- fused experts `gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I] split per expert (per-expert
  checkpoint tensors are accepted as well);
- router -> `moe/router`, `shared_expert_gate` -> `moe/shared_score`;
- all `(1+w)` norm weights kept raw.

A multimodal checkpoint's vision tower (`model.visual.*`) is mapped by `hf_vision_names`.

Qwen3-Next is normalised to the Qwen3.5-MoE form. Two optional fields extend §3.1 for it:
`mlp_only_layers` (layers whose FFN is the dense MLP) and `norm_topk_prob`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_ARCH = {
    "qwen3_5_text": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
    "qwen3_5_moe_text": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
    "qwen3_next": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
}
_COPIED = (
    "hidden_size", "vocab_size", "num_hidden_layers", "max_position_embeddings",
    "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
    "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
_MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size")
# checkpoint prefixes of the text decoder; vision and MTP tensors are not text parameters
_TEXT_PREFIXES = ("model.language_model.", "model.")
_SKIPPED_PREFIXES = ("mtp.", "model.visual.", "visual.")


def text_config_from_hf(hf_config: Any) -> dict:
    """Normalise a HF (text or multimodal) config object or dict to the §3.1 text config."""
    cfg = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    if "text_config" in cfg:
        outer, cfg = cfg, dict(cfg["text_config"])
        cfg.setdefault("model_type", outer["model_type"] + "_text")
        # transformers ties a multimodal model by its outer flag; the text flag is the fallback
        cfg["tie_word_embeddings"] = bool(
            outer.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        )
    if cfg["model_type"] not in _ARCH:
        raise ValueError(f"unsupported model_type {cfg['model_type']!r}")
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("attention_bias", False):
        raise ValueError("only SiLU activations and bias-free attention are supported")
    rope = _rope_parameters(cfg)
    arch, model_type = _ARCH[cfg["model_type"]]
    out = {"architectures": [arch], "model_type": model_type}
    out.update({k: cfg[k] for k in _COPIED})
    out["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    out["rms_norm_eps"] = float(np.float32(cfg["rms_norm_eps"]))
    out["layer_types"] = list(cfg.get("layer_types") or _default_layer_types(cfg))
    out["rope_parameters"] = {
        "rope_theta": float(rope["rope_theta"]),
        "partial_rotary_factor": float(rope.get("partial_rotary_factor", 1.0)),
    }
    if "mrope_section" in rope:
        out["rope_parameters"]["mrope_section"] = list(rope["mrope_section"])
    if model_type == "qwen3_5_text":
        out["intermediate_size"] = cfg["intermediate_size"]
        return out
    out.update({k: cfg[k] for k in _MOE})
    out["norm_topk_prob"] = bool(cfg.get("norm_topk_prob", True))
    dense = _dense_layers(cfg)
    if dense:
        out["mlp_only_layers"] = dense
        out["intermediate_size"] = cfg["intermediate_size"]
    return out


def _rope_parameters(cfg: dict) -> dict:
    """`rope_parameters`, or the pre-v5 top-level `rope_theta` / `partial_rotary_factor`."""
    rope = cfg.get("rope_parameters")
    if rope is None:
        if cfg.get("rope_scaling"):
            raise ValueError("rope_scaling is not supported")
        rope = {"rope_theta": cfg["rope_theta"],
                "partial_rotary_factor": cfg.get("partial_rotary_factor", 1.0)}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope_type {rope['rope_type']!r}")
    return rope


def _default_layer_types(cfg: dict) -> list[str]:
    """HF's derivation when `layer_types` is omitted: full attention every `interval` layers."""
    interval = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(cfg["num_hidden_layers"])]


def _dense_layers(cfg: dict) -> list[int]:
    """Qwen3-Next layers with a dense MLP (HF Qwen3NextDecoderLayer's rule)."""
    only, step = cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step", 1)
    return [i for i in range(cfg["num_hidden_layers"]) if i in only or (i + 1) % step != 0]


def logical_params_from_hf(state_dict: dict[str, torch.Tensor], config: dict) -> dict:
    """Map HF text tensors to §3.2 logical names; `config` is the normalised §3.1 dict.

    Raises ValueError on any tensor it does not consume (vision and MTP tensors are skipped).
    """
    src = {}
    for name, t in state_dict.items():
        if name.startswith(_SKIPPED_PREFIXES):
            continue
        if name == "lm_head.weight":
            src[name] = t
            continue
        prefix = next((p for p in _TEXT_PREFIXES if name.startswith(p)), None)
        if prefix is None:
            raise ValueError(f"unexpected tensor {name}")
        src[name[len(prefix):]] = t
    out = {
        "text/token_embedding": src.pop("embed_tokens.weight"),
        "text/final_norm": src.pop("norm.weight"),
    }
    head = src.pop("lm_head.weight", None)
    out["text/output_head"] = out["text/token_embedding"] if head is None else head
    for i in range(config["num_hidden_layers"]):
        out.update(_layer(src, config, i))
    if src:
        raise ValueError(f"unexpected tensors: {sorted(src)[:8]}")
    return out


def _layer(src: dict, config: dict, i: int) -> dict:
    hf, ln = f"layers.{i}.", f"text/layers/{i}/"
    out = {
        ln + "input_norm": src.pop(hf + "input_layernorm.weight"),
        ln + "post_attention_norm": src.pop(hf + "post_attention_layernorm.weight"),
    }
    if config["layer_types"][i] == "linear_attention":
        out.update(_gdn(src, config, hf + "linear_attn.", ln + "gdn/"))
    else:
        out.update(_attention(src, config, hf + "self_attn.", ln + "attention/"))
    if hf + "mlp.gate.weight" in src:
        out.update(_moe(src, config, hf + "mlp.", ln + "moe/"))
    else:
        for part in ("gate", "up", "down"):
            out[f"{ln}mlp/{part}"] = src.pop(f"{hf}mlp.{part}_proj.weight")
    return out


def _attention(src: dict, config: dict, hf: str, ln: str) -> dict:
    nq, d = config["num_attention_heads"], config["head_dim"]
    q_proj = src.pop(hf + "q_proj.weight")
    per_head = q_proj.reshape(nq, 2 * d, -1)  # each head is [query (D) | gate (D)]
    return {
        ln + "query": per_head[:, :d].reshape(nq * d, -1),
        ln + "gate": per_head[:, d:].reshape(nq * d, -1),
        ln + "key": src.pop(hf + "k_proj.weight"),
        ln + "value": src.pop(hf + "v_proj.weight"),
        ln + "output": src.pop(hf + "o_proj.weight"),
        ln + "query_norm": src.pop(hf + "q_norm.weight"),
        ln + "key_norm": src.pop(hf + "k_norm.weight"),
    }


def _gdn(src: dict, config: dict, hf: str, ln: str) -> dict:
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    nv, dv = config["linear_num_value_heads"], config["linear_value_head_dim"]
    out = {
        ln + "a_log": src.pop(hf + "A_log"),
        ln + "dt_bias": src.pop(hf + "dt_bias"),
        ln + "convolution": src.pop(hf + "conv1d.weight")[:, 0, :].t().contiguous(),
        ln + "output": src.pop(hf + "out_proj.weight"),
        ln + "norm": src.pop(hf + "norm.weight"),
    }
    if hf + "in_proj_qkvz.weight" in src:
        # Qwen3-Next: group g = [q_g (dk) | k_g (dk) | v (r·dv) | z (r·dv)], and [b (r) | a (r)]
        r = nv // nk
        qkvz = src.pop(hf + "in_proj_qkvz.weight").reshape(nk, 2 * dk + 2 * r * dv, -1)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=1)
        b, a = torch.split(src.pop(hf + "in_proj_ba.weight").reshape(nk, 2 * r, -1), [r, r], 1)
        parts = {"query": q, "key": k, "value": v, "z": z, "b_projection": b, "a_projection": a}
        out.update({ln + n: t.reshape(-1, t.shape[-1]).contiguous() for n, t in parts.items()})
        return out
    q, k, v = torch.split(src.pop(hf + "in_proj_qkv.weight"), [nk * dk, nk * dk, nv * dv])
    out.update({ln + "query": q, ln + "key": k, ln + "value": v})
    out[ln + "z"] = src.pop(hf + "in_proj_z.weight")
    out[ln + "a_projection"] = src.pop(hf + "in_proj_a.weight")
    out[ln + "b_projection"] = src.pop(hf + "in_proj_b.weight")
    return out


def _moe(src: dict, config: dict, hf: str, ln: str) -> dict:
    out = {
        ln + "router": src.pop(hf + "gate.weight"),
        ln + "shared_score": src.pop(hf + "shared_expert_gate.weight"),
    }
    for part in ("gate", "up", "down"):
        out[f"{ln}shared/{part}"] = src.pop(f"{hf}shared_expert.{part}_proj.weight")
    width = config["moe_intermediate_size"]
    if hf + "experts.gate_up_proj" in src:
        gate_up, down = src.pop(hf + "experts.gate_up_proj"), src.pop(hf + "experts.down_proj")
        for e in range(config["num_experts"]):
            out[f"{ln}experts/{e}/gate"] = gate_up[e, :width]
            out[f"{ln}experts/{e}/up"] = gate_up[e, width:]
            out[f"{ln}experts/{e}/down"] = down[e]
        return out
    for e in range(config["num_experts"]):
        for part in ("gate", "up", "down"):
            out[f"{ln}experts/{e}/{part}"] = src.pop(f"{hf}experts.{e}.{part}_proj.weight")
    return out


# --- per-layer entry points for streaming converters ------------------------------------------


def layer_params_from_hf(src: dict, config: dict, i: int) -> dict:
    """Logical tensors of text layer `i` from `src` (HF names without the `model.` prefix).

    Consumes (pops) exactly the tensors it maps, like `logical_params_from_hf`.
    """
    return _layer(src, config, i)


def mtp_params_from_hf(src: dict, config: dict) -> dict:
    """The MTP head (`mtp/...`) from `src` (HF names without the `mtp.` prefix)."""
    out = {
        "mtp/input_projection": src.pop("fc.weight"),
        "mtp/embedding_norm": src.pop("pre_fc_norm_embedding.weight"),
        "mtp/hidden_norm": src.pop("pre_fc_norm_hidden.weight"),
        "mtp/final_norm": src.pop("norm.weight"),
    }
    # the MTP layer is one gated-attention layer with the target's FFN and text-layer names
    layer_config = {**config, "layer_types": ["full_attention"], "mlp_only_layers": []}
    for name, t in _layer(src, layer_config, 0).items():
        out["mtp/layers/0/" + name[len("text/layers/0/"):]] = t
    return out


# --- the llama family (LlamaForCausalLM, Qwen3ForCausalLM; ninfer-format.md §5) -------------

_LLAMA_ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_LLAMA_LAYER = {
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_attention_norm",
    "self_attn.q_proj.weight": "attention/query",
    "self_attn.k_proj.weight": "attention/key",
    "self_attn.v_proj.weight": "attention/value",
    "self_attn.o_proj.weight": "attention/output",
    "mlp.gate_proj.weight": "mlp/gate",
    "mlp.up_proj.weight": "mlp/up",
    "mlp.down_proj.weight": "mlp/down",
}
_QWEN3_NORMS = {"self_attn.q_norm.weight": "attention/query_norm",
                "self_attn.k_norm.weight": "attention/key_norm"}


def llama_config_from_hf(hf_config: Any) -> dict:
    """The §5 text config of a HF `llama` / `qwen3` config (plain RoPE, no biases)."""
    cfg = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    if cfg["model_type"] not in _LLAMA_ARCH:
        raise ValueError(f"unsupported model_type {cfg['model_type']!r}")
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("attention_bias", False) \
            or cfg.get("mlp_bias", False):
        raise ValueError("only SiLU activations and bias-free projections are supported")
    if cfg.get("use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported")
    rope = _rope_parameters(cfg)
    heads = cfg["num_attention_heads"]
    return {
        "architectures": [_LLAMA_ARCH[cfg["model_type"]]],
        "model_type": cfg["model_type"],
        **{k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "vocab_size", "max_position_embeddings")},
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "rms_norm_eps": float(cfg["rms_norm_eps"]),
        "rope_parameters": {"rope_theta": float(rope["rope_theta"])},
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "bos_token_id": cfg.get("bos_token_id"),
        "eos_token_id": cfg.get("eos_token_id"),
    }


def llama_layer_from_hf(src: dict, config: dict, i: int) -> dict:
    """Logical tensors of llama/qwen3 layer `i` (one HF tensor each, no transforms)."""
    names = dict(_LLAMA_LAYER)
    if config["model_type"] == "qwen3":
        names.update(_QWEN3_NORMS)
    return {f"text/layers/{i}/{ours}": src.pop(f"layers.{i}.{hf}") for hf, ours in names.items()}
