"""Random-weight Qwen3.5-family models at real shapes, as a file or directly in memory.

Architectures (model-math.md §5, ninfer-format.md §3.1): `flash-next` (Qwen3-Next-80B-A3B
class, stored in the Qwen3.5-MoE form with 1-D partial RoPE and the Qwen3 vocabulary),
`35b-a3b`, `27b`, `0.8b`, and the test shapes `tiny-dense` / `tiny-moe` (real vocabulary, tiny
layers). `layers` keeps the first N layers, so the 3 GDN : 1 attention pattern is kept.

Weights are deterministic per (seed, name, row block) and scaled so activations stay finite:
matrices N(0, 1/fan_in), embedding N(0, 0.02²), zero-centred norms near 0 (the model applies
1+w), the plain GDN norm near 1, `a_log = log U(1, 16)`, `dt_bias` near 1.

`write_synthetic` streams tensor by tensor (row blocks for contiguous formats) into a `.ninfer`
file with the real Qwen tokenizer and chat template; `build_synthetic` gives a `Qwen35Model`
parameter source that generates each tensor on the target device, without any file. `mtp=True`
adds a random MTP head (model-math.md §3.1) as the `mtp` component, under the names
`ninfer convert hf` writes for a checkpoint's `mtp.*` tensors; `dflash="small"|"real"` a random
DFlash drafter as the `dflash` component (`dflash_names`: a small one sized from the target, or
the published 35B-A3B drafter's shape), `dflash2=` the same for a DFlash2 drafter (`dflash2`
component; "real": the published 27B drafter's shape).
"""

from __future__ import annotations

import copy
import math
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from . import dflash_names, qwen_resources, recipes
from .convert_hf import MTP_ARCHITECTURES
from .errors import ArtifactError
from .row_writer import StreamingWriter

_BLOCK_ELEMENTS = 1 << 24
_SHARED = {
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "vocab_size": 248320, "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10]},
}
_DENSE = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text"}
_MOE = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "norm_topk_prob": True}
_TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_num_value_heads": 4,
         "linear_value_head_dim": 16, "num_hidden_layers": 4,
         "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1]}}


def _moe(experts: int, top_k: int) -> dict:
    return {**_MOE, "num_experts": experts, "num_experts_per_tok": top_k,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}


# name -> (text config overrides, tokenizer vocabulary)
ARCHS: dict[str, tuple[dict, str]] = {
    "flash-next": ({**_moe(512, 10), "hidden_size": 2048, "num_hidden_layers": 48,
                    "num_attention_heads": 16, "num_key_value_heads": 2,
                    "linear_num_value_heads": 32, "vocab_size": 151936,
                    "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25}},
                   "qwen3"),
    "35b-a3b": ({**_moe(256, 8), "hidden_size": 2048, "num_hidden_layers": 40,
                 "num_attention_heads": 16, "num_key_value_heads": 2,
                 "linear_num_value_heads": 32}, "qwen3_5"),
    "27b": ({**_DENSE, "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24,
             "num_key_value_heads": 4, "linear_num_value_heads": 48,
             "intermediate_size": 17408}, "qwen3_5"),
    "0.8b": ({**_DENSE, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 8,
              "num_key_value_heads": 2, "linear_num_value_heads": 16,
              "intermediate_size": 3584, "tie_word_embeddings": True}, "qwen3_5"),
    "tiny-dense": ({**_DENSE, **_TINY, "intermediate_size": 96, "tie_word_embeddings": True},
                   "qwen3_5"),
    "tiny-moe": ({**_moe(8, 2), **_TINY, "moe_intermediate_size": 24,
                  "shared_expert_intermediate_size": 40}, "qwen3_5"),
}


def synth_config(arch: str, layers: int | None = None) -> dict:
    """The §3.1 text config of ``arch``, truncated to its first ``layers`` layers."""
    if arch not in ARCHS:
        raise ArtifactError(f'unknown synthetic architecture "{arch}" (known: {", ".join(ARCHS)})')
    config = copy.deepcopy({**_SHARED, **ARCHS[arch][0]})
    total = config["num_hidden_layers"]
    if layers is not None:
        if not 1 <= layers <= total:
            raise ArtifactError(f"--layers must be in 1..{total} for {arch}")
        config["num_hidden_layers"] = layers
    config["layer_types"] = ["full_attention" if i % 4 == 3 else "linear_attention"
                             for i in range(config["num_hidden_layers"])]
    return config


def dflash_config(config: dict, dflash: str | None, dflash2: bool = False) -> dict | None:
    """The random drafter's component config for text ``config`` ("small", "real" or None; a
    DFlash2 drafter with ``dflash2``)."""
    if dflash is None:
        return None
    flag = "--dflash2" if dflash2 else "--dflash"
    if dflash not in ("small", "real"):
        raise ArtifactError(f'{flag} is "small" or "real", not "{dflash}"')
    out = dflash_names.synth_config(config, dflash == "real", dflash2)
    taps = out["dflash_config"]["target_layer_ids"]
    if out["hidden_size"] != config["hidden_size"] or max(taps) >= config["num_hidden_layers"] - 1:
        raise ArtifactError(f"the real {'DFlash2' if dflash2 else 'DFlash'} drafter (width "
                            f"{out['hidden_size']}, taps {taps}) fits the "
                            f"{'27b' if dflash2 else '35b-a3b'} target, all layers")
    return out


def parameter_shapes(config: dict, mtp: bool = False,
                     *drafters: dict) -> dict[str, tuple[int, ...]]:
    """Every logical parameter `Qwen35Model` reads for ``config`` (and, with ``mtp``, the MTP
    head `models.mtp.MtpHead` reads; for each DFlash / DFlash2 drafter config, the drafter's),
    in writing order."""
    h, v = config["hidden_size"], config["vocab_size"]
    out = {"text/token_embedding": (v, h), "text/final_norm": (h,)}
    if not config["tie_word_embeddings"]:
        out["text/output_head"] = (v, h)
    for i, kind in enumerate(config["layer_types"]):
        p = f"text/layers/{i}/"
        out[p + "input_norm"] = out[p + "post_attention_norm"] = (h,)
        out.update({p + k: s for k, s in (_gdn(config) if kind == "linear_attention"
                                          else _attention(config)).items()})
        out.update({p + k: s for k, s in _ffn(config, i).items()})
    if mtp:  # one gated-attention layer with the target's FFN type (`hf_names.mtp_params_from_hf`)
        out.update({"mtp/input_projection": (h, 2 * h), "mtp/embedding_norm": (h,),
                    "mtp/hidden_norm": (h,), "mtp/final_norm": (h,)})
        p = "mtp/layers/0/"
        out[p + "input_norm"] = out[p + "post_attention_norm"] = (h,)
        out.update({p + k: s for k, s in {**_attention(config), **_ffn(config)}.items()})
    for drafter in drafters:
        out.update(dflash_names.parameter_shapes(drafter, v))
    return out


def mtp_component(config: dict) -> dict:
    """The `mtp` component entry for a hybrid text ``config`` (ninfer-format.md §3.1)."""
    return {"config": {"architectures": [MTP_ARCHITECTURES[config["architectures"][0]]]},
            "target": "text"}


def _gdn(c: dict) -> dict:
    h, nv = c["hidden_size"], c["linear_num_value_heads"]
    kg, vg = c["linear_num_key_heads"] * c["linear_key_head_dim"], nv * c["linear_value_head_dim"]
    return {"gdn/a_log": (nv,), "gdn/dt_bias": (nv,),
            "gdn/convolution": (c["linear_conv_kernel_dim"], 2 * kg + vg),
            "gdn/a_projection": (nv, h), "gdn/b_projection": (nv, h), "gdn/query": (kg, h),
            "gdn/key": (kg, h), "gdn/value": (vg, h), "gdn/z": (vg, h), "gdn/output": (h, vg),
            "gdn/norm": (c["linear_value_head_dim"],)}


def _attention(c: dict) -> dict:
    h, d = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    return {"attention/query": (q, h), "attention/gate": (q, h), "attention/key": (kv, h),
            "attention/value": (kv, h), "attention/output": (h, q),
            "attention/query_norm": (d,), "attention/key_norm": (d,)}


def _swiglu(prefix: str, h: int, width: int) -> dict:
    return {prefix + "gate": (width, h), prefix + "up": (width, h), prefix + "down": (h, width)}


def _ffn(c: dict, layer: int | None = None) -> dict:
    """Layer `layer`'s FFN (None: the MTP layer's, the MoE where the model has one)."""
    h = c["hidden_size"]
    if "num_experts" not in c or layer in c.get("mlp_only_layers", ()):
        return _swiglu("mlp/", h, c["intermediate_size"])
    out = {"moe/router": (c["num_experts"], h), "moe/shared_score": (1, h)}
    for e in range(c["num_experts"]):
        out.update(_swiglu(f"moe/experts/{e}/", h, c["moe_intermediate_size"]))
    out.update(_swiglu("moe/shared/", h, c["shared_expert_intermediate_size"]))
    return out


def synthetic_blocks(name: str, shape: tuple[int, ...], seed: int,
                     device: torch.device | str = "cpu") -> Iterator[torch.Tensor]:
    """Float32 row blocks of parameter ``name``, reproducible from (seed, name, block)."""
    rows = shape[0] if len(shape) == 2 else 1
    step = max(1, _BLOCK_ELEMENTS // (shape[-1] if len(shape) == 2 else 1))
    for b, r0 in enumerate(range(0, rows, step)):
        block = (min(rows, r0 + step) - r0, shape[1]) if len(shape) == 2 else shape
        generator = torch.Generator(device).manual_seed(
            zlib.crc32(f"{seed}/{name}/{b}".encode()))
        yield _draw(name, block, generator, device)


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator, device) -> torch.Tensor:
    normal = lambda std: torch.randn(shape, generator=gen, device=device) * std  # noqa: E731
    leaf = name.rsplit("/", 1)[-1]
    if leaf == "a_log":
        return torch.empty(shape, device=device).uniform_(1.0, 16.0, generator=gen).log_()
    if leaf == "dt_bias" or name.endswith("gdn/norm"):
        return 1.0 + normal(0.1)
    if len(shape) == 1 and name.startswith(("dflash/", "dflash2/")):
        return 1.0 + normal(0.1)  # the drafters' plain Qwen3 norms multiply by w
    if leaf == "base_kernel":  # DFlash2's convolutions: near the identity (tap 0 is 1)
        return normal(0.1) + (torch.arange(shape[1], device=device) == 0).view(1, -1, 1)
    if leaf == "kernel_projection":
        return normal(0.1 / math.sqrt(shape[-1]))  # dynamic coefficients ~0.1
    if len(shape) == 1:
        return normal(0.1)  # zero-centred norms: the model multiplies by 1 + w
    if leaf == "token_embedding":
        return normal(0.02)
    return normal(1.0 / math.sqrt(shape[-1]))


def write_synthetic(
    arch: str,
    path: str | os.PathLike,
    *,
    layers: int | None = None,
    recipe: str = "bf16",
    seed: int = 0,
    name: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    mtp: bool = False,
    dflash: str | None = None,
    device: torch.device | str = "cpu",
    dflash2: str | None = None,
) -> Path:
    """Write a random-weight ``arch`` artifact with the real Qwen tokenizer (and, with ``mtp``,
    a random MTP head; with ``dflash`` / ``dflash2`` "small" or "real", a random DFlash /
    DFlash2 drafter); returns the path. ``device``: where weights are drawn and fp8-row
    encoded (a GPU writes the 8-layer 35B-A3B in seconds, not minutes); its generator draws
    other values than the CPU's."""
    config = synth_config(arch, layers)
    choose = recipes.recipe(recipe)
    drafters = {name: c for name, c in (("dflash", dflash_config(config, dflash)),
                                        ("dflash2", dflash_config(config, dflash2, True)))
                if c is not None}
    shapes = parameter_shapes(config, mtp, *drafters.values())
    report = progress or (lambda *_: None)
    metadata = {"name": name or f"synth-{arch}",
                "source": {"format": "synthetic", "arch": arch, "seed": seed, "recipe": recipe}}
    components = {"text": {"config": config}}
    if mtp:
        components["mtp"] = mtp_component(config)
    for name, drafter in drafters.items():
        components[name] = dflash_names.component(drafter)
    total = len(shapes) + 1
    with StreamingWriter(path, metadata=metadata, components=components) as writer:
        for role, data in qwen_resources.resources(ARCHS[arch][1]).items():
            writer.add_resource(role, data)
        report(1, total, "tokenizer and chat template")
        for step, (logical, shape) in enumerate(shapes.items(), start=2):
            fmt = choose(logical, shape)
            # bf16-round what will not be stored as fp32, so a block costs half the memory
            cast = torch.float32 if fmt == "fp32" else torch.bfloat16
            blocks = (b.to(cast) for b in synthetic_blocks(logical, shape, seed, device))
            writer.add_rows(logical, shape, fmt, blocks)
            report(step, total, logical)
        if config["tie_word_embeddings"]:
            writer.add_alias("text/output_head", "text/token_embedding")
    return Path(path)


def build_synthetic(
    arch: str,
    device: torch.device | str,
    dtype: torch.dtype,
    layers: int | None = None,
    seed: int = 0,
    mtp: bool = False,
) -> tuple[dict, Callable[[str, tuple[int, ...]], torch.Tensor]]:
    """(config, params) for `Qwen35Model(config, params)` (and, with ``mtp``, for
    `MtpHead(model, params)`), generated on ``device`` in ``dtype``.

    Each tensor is drawn on the device when the model asks for it (no file, no host copy);
    `a_log` and `dt_bias` stay fp32. On the CPU the values equal `write_synthetic`'s before
    the recipe's rounding.
    """
    config = synth_config(arch, layers)
    shapes = parameter_shapes(config, mtp)

    def params(logical: str, shape: tuple[int, ...]) -> torch.Tensor:
        if shapes.get(logical) != tuple(shape):
            raise ArtifactError(f'synthetic {arch} has no parameter "{logical}" {list(shape)}')
        keep = torch.float32 if logical.endswith(("a_log", "dt_bias")) else dtype
        out = torch.empty(shape, dtype=keep, device=device)
        rows = out.view(-1, shape[-1]) if len(shape) == 2 else out.view(1, -1)
        start = 0
        for block in synthetic_blocks(logical, shape, seed, device):
            block = block.view(-1, rows.shape[1])  # filled in place: no second full-size copy
            rows[start : start + block.shape[0]] = block
            start += block.shape[0]
        return out

    return config, params
