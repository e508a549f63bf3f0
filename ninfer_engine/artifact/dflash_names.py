"""The `dflash` and `dflash2` components: their configs, logical parameter names, and z-lab's
checkpoint names.

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

A DFlash2 drafter (`DFlash2DraftModel`, model-math.md §3.3; its layout and arithmetic as vLLM's
`qwen3_dflash2.py` reads the published checkpoints) is the same stack under `dflash2/` with, per
layer, a grouped dynamic convolution around the attention and one around the MLP
(`layers.{i}.{attention,mlp}_conv.{base_kernel [2, taps, H], kernel_projection.weight
[2·taps·H/group, H]}` → `dflash2/layers/i/{attention,mlp}_conv/{base_kernel,
kernel_projection}`), and a candidate selector (`candidate_selector.{predecessor_codebook,
successor_codebook} [V, rank]`, `candidate_selector.hidden_projection.weight [rank, H]` →
`dflash2/candidate_selector/...`); `dflash_config` adds `conv_kernel_size`, `conv_group_size`,
`selector_rank`, `selector_top_k` (and optionally `input_embedding_scale`,
`output_multiplier`, `final_logit_softcapping`).
"""
from __future__ import annotations

import copy

from .errors import ArtifactError

DFLASH_ARCHITECTURE = "DFlashDraftModel"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
# the component that holds each architecture's drafter, and its logical names' prefix
BACKENDS = {DFLASH_ARCHITECTURE: "dflash", DFLASH2_ARCHITECTURE: "dflash2"}
ARCHITECTURES = {top: arch for arch, top in BACKENDS.items()}  # each component's drafter

# the published 35B-A3B drafter (ninfer-format.md §3.1 "Drafters", model-math.md §3.3)
REAL_35B = {
    "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 6144, "num_hidden_layers": 6, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1e7}, "sliding_window": 4096,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "block_size": 16,
    "dflash_config": {"target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
                      "mask_token_id": 248077},
}

# the published 27B drafter (ninfer-format.md §3.1 "Drafters", model-math.md §3.3)
REAL_27B_DFLASH2 = {
    "hidden_size": 5120, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 17408, "num_hidden_layers": 5, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1e7}, "sliding_window": 2048,
    "layer_types": ["sliding_attention"] * 5, "block_size": 8,
    "dflash_config": {"target_layer_ids": [5, 19, 33, 47, 61], "mask_token_id": 248070,
                      "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                      "selector_top_k": 16},
}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

# the config keys the component keeps (ninfer-format.md §3.1 dflash)
_KEPT = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
         "intermediate_size", "num_hidden_layers", "rms_norm_eps", "sliding_window",
         "layer_types", "block_size", "num_target_layers")


def backend(config: dict) -> str:
    """"dflash" or "dflash2": the component (and logical-name prefix) of drafter `config`."""
    arch = (config.get("architectures") or [DFLASH_ARCHITECTURE])[0]
    if arch not in BACKENDS:
        raise ArtifactError(f"a drafter of architecture {arch} is not built (only "
                            f"{' and '.join(BACKENDS)})")
    return BACKENDS[arch]


def component_config(hf: dict) -> dict:
    """The `dflash` or `dflash2` component config from a z-lab checkpoint's config.json
    (`rope_theta` at the top level in older transformers, under `rope_parameters` in newer
    ones)."""
    if hf.get("attention_bias"):
        raise ArtifactError("a DFlash drafter with attention biases is not built "
                            "(attention_bias is true in its config)")
    arch = ARCHITECTURES[backend(hf)]
    out = {k: copy.deepcopy(hf[k]) for k in _KEPT if k in hf}
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 1e6))
    out.update(architectures=[arch], model_type="qwen3", rope_parameters={"rope_theta": theta},
               dflash_config=dict(hf.get("dflash_config") or {}))
    return out


def synth_config(target: dict, real: bool, dflash2: bool = False) -> dict:
    """A random drafter's config for a text config `target`: the published shape (`real`: the
    35B's DFlash, the 27B's DFlash2), or a small one sized from the target (tests): 2 layers
    (DFlash: sliding, then full; DFlash2: both sliding), window 8, taps spread over the
    target's layers but its last, the mask one row below the vocabulary; DFlash2's
    convolutions of 2 taps over groups of 16 channels and a selector of rank 8 over 4
    candidates."""
    if real:
        base = copy.deepcopy(REAL_27B_DFLASH2 if dflash2 else REAL_35B)
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
        if dflash2:
            base["layer_types"] = ["sliding_attention"] * 2
            base["block_size"] = 8
            base["dflash_config"].update(conv_kernel_size=2, conv_group_size=16,
                                         selector_rank=8, selector_top_k=4)
    base["num_target_layers"] = target["num_hidden_layers"]
    arch = DFLASH2_ARCHITECTURE if dflash2 else DFLASH_ARCHITECTURE
    return {"architectures": [arch], "model_type": "qwen3", **base}


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
    if backend(c) == "dflash2":
        if any(not isinstance(dc.get(k), int) or dc[k] < 1 for k in DFLASH2_KEYS):
            return f"lacks a positive dflash_config.{' / '.join(DFLASH2_KEYS)}"
        if c["hidden_size"] % dc["conv_group_size"]:
            return (f"groups its convolutions by {dc['conv_group_size']} channels, which do "
                    f"not divide its width {c['hidden_size']}")
    return None


def component(config: dict) -> dict:
    """The `dflash` / `dflash2` component entry (ninfer-format.md §1.2 `components`)."""
    return {"config": config, "target": "text"}


def parameter_shapes(c: dict, vocab: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every logical parameter of a drafter with config `c`, in writing order (a DFlash2
    selector's codebooks have a row for each of the target's `vocab` ids)."""
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    dc, top = c["dflash_config"], backend(c)
    taps = len(dc["target_layer_ids"])
    out = {f"{top}/input_projection": (h, taps * h), f"{top}/hidden_norm": (h,),
           f"{top}/final_norm": (h,)}
    for n in range(c["num_hidden_layers"]):
        p = f"{top}/layers/{n}/"
        out.update({p + "input_norm": (h,), p + "post_attention_norm": (h,),
                    p + "attention/query": (q, h), p + "attention/key": (kv, h),
                    p + "attention/value": (kv, h), p + "attention/output": (h, q),
                    p + "attention/query_norm": (d,), p + "attention/key_norm": (d,),
                    p + "mlp/gate": (i, h), p + "mlp/up": (i, h), p + "mlp/down": (h, i)})
        if top == "dflash2":
            conv = dc["conv_kernel_size"]
            for branch in ("attention_conv/", "mlp_conv/"):
                out.update({p + branch + "base_kernel": (2, conv, h),
                            p + branch + "kernel_projection":
                                (2 * conv * (h // dc["conv_group_size"]), h)})
    if top == "dflash2":
        assert vocab is not None, "a DFlash2 selector's codebooks need the target's vocabulary"
        rank = dc["selector_rank"]
        out.update({"dflash2/candidate_selector/hidden_projection": (rank, h),
                    "dflash2/candidate_selector/predecessor_codebook": (vocab, rank),
                    "dflash2/candidate_selector/successor_codebook": (vocab, rank)})
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
_TOP = {"fc.weight": "input_projection", "hidden_norm.weight": "hidden_norm",
        "norm.weight": "final_norm"}
# DFlash2's beside those
_LAYER2 = {f"{branch}.{leaf}": f"{branch}/{leaf.removesuffix('.weight')}"
           for branch in ("attention_conv", "mlp_conv")
           for leaf in ("base_kernel", "kernel_projection.weight")}
_TOP2 = {f"candidate_selector.{leaf}": f"candidate_selector/{leaf.removesuffix('.weight')}"
         for leaf in ("predecessor_codebook", "successor_codebook", "hidden_projection.weight")}
# each component's (top-level, per-layer) name maps
_NAMES = {"dflash": (_TOP, _LAYER), "dflash2": ({**_TOP, **_TOP2}, {**_LAYER, **_LAYER2})}


def logical_name(hf_name: str, top: str = "dflash") -> str | None:
    """The logical name of a z-lab checkpoint tensor of a `top` ("dflash" or "dflash2") drafter
    (an optional `model.` prefix dropped); None for a name the drafter does not read (rotary
    tables)."""
    name = hf_name.removeprefix("model.")
    tops, layer = _NAMES[top]
    if name in tops:
        return f"{top}/{tops[name]}"
    if name.startswith("layers."):
        index, _, rest = name[len("layers."):].partition(".")
        if rest in layer:
            return f"{top}/layers/{int(index)}/{layer[rest]}"
    if name.endswith("rotary_emb.inv_freq"):
        return None
    raise ArtifactError(f'unknown DFlash checkpoint tensor "{hf_name}"')
