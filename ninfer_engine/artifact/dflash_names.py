"""The `dflash` component: its config, its logical parameter names, and z-lab's checkpoint names.

A DFlash drafter (z-lab, `DFlashDraftModel`, model-math.md §3.3) is a checkpoint of its own: a
stack of dense Qwen3 blocks with an input projection `fc` over the target's tap features, a
`hidden_norm` after it and a final `norm`; no embedding and no head (it reuses the target's).
Names follow z-lab's `dflash/model.py` (github.com/z-lab/dflash, `DFlashDraftModel.__init__`,
`Qwen3DFlashDecoderLayer`, `Qwen3DFlashAttention`): `fc.weight`, `hidden_norm.weight`,
`norm.weight`, `layers.{i}.{input_layernorm, post_attention_layernorm}.weight`,
`layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `layers.{i}.self_attn.{q,k}_norm.weight`,
`layers.{i}.mlp.{gate,up,down}_proj.weight`.

Logical names (ours, beside the text and mtp ones of ninfer-format.md §3.2): `dflash/
{input_projection [H, n·H], hidden_norm, final_norm}` and `dflash/layers/i/{input_norm,
post_attention_norm, attention/{query, key, value, output, query_norm, key_norm},
mlp/{gate, up, down}}`. The drafter's norms are plain Qwen3 RMSNorms (`x̂·w`), stored as the
checkpoint has them (the text component's zero-centred `1+w` convention does not apply).
"""
from __future__ import annotations

import copy

from .errors import ArtifactError

DFLASH_ARCHITECTURE = "DFlashDraftModel"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"

# the published 35B-A3B drafter (ninfer-format.md §3.1 "Drafters", model-math.md §3.3)
REAL_35B = {
    "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 6144, "num_hidden_layers": 6, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1e7}, "sliding_window": 4096,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "block_size": 16,
    "dflash_config": {"target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
                      "mask_token_id": 248077},
}

# the config keys the component keeps (ninfer-format.md §3.1 dflash)
_KEPT = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
         "intermediate_size", "num_hidden_layers", "rms_norm_eps", "sliding_window",
         "layer_types", "block_size", "num_target_layers")


def component_config(hf: dict) -> dict:
    """The `dflash` component config from a z-lab checkpoint's config.json (`rope_theta` at the
    top level in older transformers, under `rope_parameters` in newer ones)."""
    if hf.get("attention_bias"):
        raise ArtifactError("a DFlash drafter with attention biases is not built "
                            "(attention_bias is true in its config)")
    out = {k: copy.deepcopy(hf[k]) for k in _KEPT if k in hf}
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 1e6))
    out.update(architectures=[DFLASH_ARCHITECTURE], model_type="qwen3",
               rope_parameters={"rope_theta": theta},
               dflash_config=dict(hf.get("dflash_config") or {}))
    return out


def synth_config(target: dict, real: bool) -> dict:
    """A random drafter's config for a text config `target`: the published 35B shape (`real`),
    or a small one sized from the target (tests): 2 layers (sliding, then full), window 8,
    taps spread over the target's layers but its last, the mask one row below the vocabulary."""
    if real:
        base = copy.deepcopy(REAL_35B)
    else:
        layers = target["num_hidden_layers"]
        taps = sorted({max(0, round(i * (layers - 2) / 2)) for i in range(3)})
        base = {"hidden_size": target["hidden_size"], "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
                "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
                "rope_parameters": {"rope_theta": 1e7}, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"], "block_size": 16,
                "dflash_config": {"target_layer_ids": taps,
                                  "mask_token_id": target["vocab_size"] - 1}}
    base["num_target_layers"] = target["num_hidden_layers"]
    return {"architectures": [DFLASH_ARCHITECTURE], "model_type": "qwen3", **base}


def mismatch(c: dict, target: dict) -> str | None:
    """Why drafter config `c` cannot serve the text config `target` (one line, to follow "the
    dflash component of X" or "the DFlash checkpoint"), or None."""
    dc = c.get("dflash_config") or {}
    taps, mask = dc.get("target_layer_ids"), dc.get("mask_token_id")
    depth = target["num_hidden_layers"]
    if not taps or mask is None:
        return "lacks dflash_config.target_layer_ids or mask_token_id"
    if any(not 0 <= t < depth - 1 for t in taps):
        # the last layer's HF hidden state is final-normed: no drafter taps it
        return f"taps layers {taps}, beyond 0..{depth - 2} of the target's {depth} layers"
    if c["hidden_size"] != target["hidden_size"]:
        return (f"is {c['hidden_size']} wide, the target {target['hidden_size']} (the drafter "
                "reads the target's embeddings)")
    if not 0 <= mask < target["vocab_size"]:
        return f"masks with token {mask}, beyond the target's {target['vocab_size']} rows"
    kinds = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    if len(kinds) != c["num_hidden_layers"]:
        return f"lists {len(kinds)} layer_types for {c['num_hidden_layers']} layers"
    if "sliding_attention" in kinds and not c.get("sliding_window"):
        return "has sliding layers but no sliding_window"
    return None


def component(config: dict) -> dict:
    """The `dflash` component entry (ninfer-format.md §1.2 `components`)."""
    return {"config": config, "target": "text"}


def parameter_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Every logical parameter of a drafter with config `c`, in writing order."""
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    taps = len(c["dflash_config"]["target_layer_ids"])
    out = {"dflash/input_projection": (h, taps * h), "dflash/hidden_norm": (h,),
           "dflash/final_norm": (h,)}
    for n in range(c["num_hidden_layers"]):
        p = f"dflash/layers/{n}/"
        out.update({p + "input_norm": (h,), p + "post_attention_norm": (h,),
                    p + "attention/query": (q, h), p + "attention/key": (kv, h),
                    p + "attention/value": (kv, h), p + "attention/output": (h, q),
                    p + "attention/query_norm": (d,), p + "attention/key_norm": (d,),
                    p + "mlp/gate": (i, h), p + "mlp/up": (i, h), p + "mlp/down": (h, i)})
    return out


_LAYER = {"input_layernorm.weight": "input_norm",
          "post_attention_layernorm.weight": "post_attention_norm",
          "self_attn.q_proj.weight": "attention/query", "self_attn.k_proj.weight": "attention/key",
          "self_attn.v_proj.weight": "attention/value",
          "self_attn.o_proj.weight": "attention/output",
          "self_attn.q_norm.weight": "attention/query_norm",
          "self_attn.k_norm.weight": "attention/key_norm",
          "mlp.gate_proj.weight": "mlp/gate", "mlp.up_proj.weight": "mlp/up",
          "mlp.down_proj.weight": "mlp/down"}
_TOP = {"fc.weight": "dflash/input_projection", "hidden_norm.weight": "dflash/hidden_norm",
        "norm.weight": "dflash/final_norm"}


def logical_name(hf_name: str) -> str | None:
    """The logical name of a z-lab checkpoint tensor (an optional `model.` prefix dropped);
    None for a name the drafter does not read (rotary tables)."""
    name = hf_name.removeprefix("model.")
    if name in _TOP:
        return _TOP[name]
    if name.startswith("layers."):
        index, _, rest = name[len("layers."):].partition(".")
        if rest in _LAYER:
            return f"dflash/layers/{int(index)}/{_LAYER[rest]}"
    if name.endswith("rotary_emb.inv_freq"):
        return None
    raise ArtifactError(f'unknown DFlash checkpoint tensor "{hf_name}"')
