"""HF ↔ ninfer logical names for the vision tower of the multimodal qwen3_5 / qwen3_5_moe models.

`vision_config_from_hf` reads a multimodal HF config's `vision_config` into the ninfer-format.md
§3.1 vision config, and `vision_shapes` lists the shape of every `vision/...` parameter it
implies. `vision_globals_from_hf` and `vision_block_from_hf` map the checkpoint's vision tower
(`model.visual.*`, model-math.md §6) to the §3.2 `vision/...` names, applying the documented
layout transforms:
- the fused `attn.qkv` rows `[q | k | v]` split into `attention/{query,key,value}` (+ `_bias`);
- the Conv3d patch kernel [H, 3, T, P, P] flattened into the matrix [H, 3·T·P·P].

The text decoder's names (and the MTP head's) are mapped by `hf_names`.
"""

from __future__ import annotations

from typing import Any

_VISION_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
_VISION_COPIED = ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size",
                  "temporal_patch_size", "spatial_merge_size", "num_position_embeddings",
                  "out_hidden_size")
# HF `blocks.b.` suffix -> name under `vision/layers/b/` (the fused qkv is split separately)
_VISION_BLOCK = {
    "attn.proj.weight": "attention/output", "attn.proj.bias": "attention/output_bias",
    "mlp.linear_fc1.weight": "mlp/fc1", "mlp.linear_fc1.bias": "mlp/fc1_bias",
    "mlp.linear_fc2.weight": "mlp/fc2", "mlp.linear_fc2.bias": "mlp/fc2_bias",
    "norm1.weight": "norm1_weight", "norm1.bias": "norm1_bias",
    "norm2.weight": "norm2_weight", "norm2.bias": "norm2_bias",
}
_VISION_MERGER = {
    "norm.weight": "norm_weight", "norm.bias": "norm_bias",
    "linear_fc1.weight": "fc1", "linear_fc1.bias": "fc1_bias",
    "linear_fc2.weight": "fc2", "linear_fc2.bias": "fc2_bias",
}


def vision_config_from_hf(hf_config: Any) -> dict:
    """The §3.1 vision config of a multimodal Qwen3.5 / Qwen3.5-MoE HF config (plus
    `out_hidden_size`, the merger's output width, which must equal the text width)."""
    cfg = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    if cfg.get("model_type") not in _VISION_MODEL_TYPES or not cfg.get("vision_config"):
        raise ValueError(f"no Qwen3.5 vision_config in a {cfg.get('model_type')!r} config")
    vision = cfg["vision_config"]
    if vision.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh" \
            or vision.get("in_channels", 3) != 3:
        raise ValueError("only 3-channel vision towers with GELU-tanh blocks are supported")
    if vision["out_hidden_size"] != cfg["text_config"]["hidden_size"]:
        raise ValueError(f"vision out_hidden_size {vision['out_hidden_size']} differs from the "
                         f"text hidden_size {cfg['text_config']['hidden_size']}")
    # the outer model type decides: nested vision configs do not always carry their own
    return {"model_type": cfg["model_type"] + "_vision", **{k: vision[k] for k in _VISION_COPIED}}


def vision_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Logical name -> shape of every `vision/...` parameter of the §3.1 vision `config`."""
    h, i, out = config["hidden_size"], config["intermediate_size"], config["out_hidden_size"]
    t, p = config["temporal_patch_size"], config["patch_size"]
    merged = h * config["spatial_merge_size"] ** 2
    shapes = {"vision/patch_embedding": (h, 3 * t * p * p), "vision/patch_embedding_bias": (h,),
              "vision/position_embedding": (config["num_position_embeddings"], h),
              "vision/merger/norm_weight": (h,), "vision/merger/norm_bias": (h,),
              "vision/merger/fc1": (merged, merged), "vision/merger/fc1_bias": (merged,),
              "vision/merger/fc2": (out, merged), "vision/merger/fc2_bias": (out,)}
    block = {"mlp/fc1": (i, h), "mlp/fc1_bias": (i,), "mlp/fc2": (h, i), "mlp/fc2_bias": (h,)}
    for role in ("query", "key", "value", "output"):
        block[f"attention/{role}"] = (h, h)
        block[f"attention/{role}_bias"] = (h,)
    block.update({f"norm{n}_{w}": (h,) for n in (1, 2) for w in ("weight", "bias")})
    for b in range(config["depth"]):
        shapes.update({f"vision/layers/{b}/{role}": s for role, s in block.items()})
    return shapes


def vision_globals_from_hf(src: dict) -> dict:
    """Patch and position embeddings and the merger, from `src` (names after `model.visual.`).

    The Conv3d patch kernel [H, 3, T, P, P] becomes the matrix [H, 3·T·P·P] (C, T, H, W order,
    the order patches are cut in), since its stride equals its kernel.
    """
    out = {
        "vision/patch_embedding": src.pop("patch_embed.proj.weight").flatten(1),
        "vision/patch_embedding_bias": src.pop("patch_embed.proj.bias"),
        "vision/position_embedding": src.pop("pos_embed.weight"),
    }
    out.update({"vision/merger/" + ours: src.pop("merger." + theirs)
                for theirs, ours in _VISION_MERGER.items()})
    return out


def vision_block_from_hf(src: dict, b: int) -> dict:
    """Logical tensors of vision block `b`; HF's fused `attn.qkv` rows `[q | k | v]` (equal
    thirds, each heads-major) are split into `attention/{query,key,value}` (+ `_bias`)."""
    hf, ln = f"blocks.{b}.", f"vision/layers/{b}/attention/"
    out = {}
    for suffix, tail in (("weight", ""), ("bias", "_bias")):
        q, k, v = src.pop(f"{hf}attn.qkv.{suffix}").chunk(3)
        out.update({f"{ln}query{tail}": q, f"{ln}key{tail}": k, f"{ln}value{tail}": v})
    out.update({f"vision/layers/{b}/{ours}": src.pop(hf + theirs)
                for theirs, ours in _VISION_BLOCK.items()})
    return out
