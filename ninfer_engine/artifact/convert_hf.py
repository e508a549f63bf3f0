"""Hugging Face safetensors directory → `.ninfer` v3 (ninfer-format.md §3, §4).

Families: `qwen3_5` / `qwen3_5_text` (dense hybrid), `qwen3_5_moe` / `qwen3_5_moe_text`,
`qwen3_next` (re-sliced into the Qwen3.5-MoE bindings by `hf_names`), and the §5 llama family
(`llama`, `qwen3`). The MTP head (`mtp.*`) becomes an `mtp` component and the vision tower
(`model.visual.*`) a `vision` component with the preprocessor configs as its resources, unless
the caller drops it (`skip_vision`). A z-lab DFlash or DFlash2 drafter checkpoint (its own
folder, `dflash`) becomes a `dflash` or `dflash2` component (`dflash_names`, by its
architecture), checked against the text config.

Streaming: the embedding and head are copied in row blocks, every other tensor is read when its
layer (or vision block) is converted, so peak memory is about one layer (plus one tensor's
encoding).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from pathlib import Path

from . import dflash_names, hf_names, hf_vision_names
from . import recipes
from .errors import ArtifactError
from .hf_checkpoint import VISION_RESOURCE_FILES, HfCheckpoint, LazyTensors
from .row_writer import StreamingWriter

Progress = Callable[[int, int, str], None]

_QWEN = {"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"}
_LLAMA = {"llama", "qwen3"}
# the `mtp` component architecture of each hybrid text architecture (ninfer-format.md §3.1)
MTP_ARCHITECTURES = {"Qwen3_5ForCausalLM": "Qwen3_5MTP", "Qwen3_5MoeForCausalLM": "Qwen3_5MoeMTP"}
_VISION_PREFIXES = ("model.visual.", "visual.")
_LAYER = re.compile(r"layers\.(\d+)\.")
_BLOCK = re.compile(r"blocks\.(\d+)\.")


def convert_hf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    recipe: str = "bf16",
    name: str | None = None,
    skip_vision: bool = False,
    progress: Progress | None = None,
    dflash: str | os.PathLike | None = None,
) -> Path:
    """Convert the checkpoint folder ``src`` (and a DFlash drafter's checkpoint folder
    ``dflash``) to ``dst`` with ``recipe``; returns ``dst``.

    ``progress(done, total, what)`` is called after the resources and after each layer.
    """
    src, dst = Path(src), Path(dst)
    choose = recipes.recipe(recipe)
    report = progress or (lambda *_: None)
    try:
        checkpoint = HfCheckpoint(src)
        drafter = None
        if dflash is not None:
            try:
                drafter = HfCheckpoint(dflash)
            except ArtifactError as error:
                raise error.at(Path(dflash)) from None
        return _convert(checkpoint, dst, recipe, choose, name, skip_vision, report, drafter)
    except ArtifactError as error:
        raise error.at(src) from None
    except KeyError as error:  # a config field or tensor the family needs
        raise ArtifactError(f"missing {error.args[0]!r}", src) from None
    except ValueError as error:  # hf_names refusing a config
        raise ArtifactError(str(error), src) from None


def text_config(hf_config: dict) -> dict:
    """The §3.1 (Qwen3.5 family) or §5 (llama family) text config of a HF `config.json`."""
    model_type = hf_config.get("model_type")
    if model_type in _QWEN:
        return hf_names.text_config_from_hf(hf_config)
    if model_type in _LLAMA:
        return hf_names.llama_config_from_hf(hf_config)
    raise ArtifactError(f'unsupported model_type "{model_type}" '
                        f"(known: {', '.join(sorted(_QWEN | _LLAMA))})")


def _convert(checkpoint, dst, recipe_name, choose, name, skip_vision, progress,
             drafter: HfCheckpoint | None = None) -> Path:
    config = text_config(checkpoint.config)
    groups = _group(checkpoint.names)
    vision = None if skip_vision else _vision_config(checkpoint.config, groups["vision"])
    components = {"text": {"config": config}}
    if groups["mtp"]:
        arch = MTP_ARCHITECTURES.get(config["architectures"][0])
        if arch is None:
            raise ArtifactError(f"MTP tensors in a {config['model_type']} checkpoint")
        components["mtp"] = {"config": {"architectures": [arch]}, "target": "text"}
    if vision:
        components["vision"] = {"config": vision, "target": "text"}
    kind = None  # the drafter's component, "dflash" or "dflash2"
    if drafter is not None:
        drafter_config = _dflash_config(drafter, config)
        kind = dflash_names.backend(drafter_config)
        components[kind] = dflash_names.component(drafter_config)
    metadata = {
        "name": name or checkpoint.folder.resolve().name,
        "source": {"format": "hf-safetensors", "model_type": checkpoint.config["model_type"],
                   "recipe": recipe_name},
    }
    layers = config["num_hidden_layers"]
    total = (2 + layers + bool(groups["mtp"]) + (vision["depth"] + 1 if vision else 0)
             + (drafter is not None))
    step = itertools.count(1)
    with StreamingWriter(dst, metadata=metadata, components=components) as writer:
        for role, data in checkpoint.resources().items():
            if role not in VISION_RESOURCE_FILES:
                writer.add_resource(role, data)
            elif vision:  # preprocessor configs belong to the vision tower, dropped with it
                writer.add_resource(role, data, "vision")
        progress(next(step), total, "resources")
        _globals(checkpoint, writer, config, groups["top"], choose)
        progress(next(step), total, "embedding, final norm, head")
        for i in range(layers):
            lazy = LazyTensors(checkpoint, groups["layers"].pop(i, {}))
            if config["model_type"] in _LLAMA:
                params = hf_names.llama_layer_from_hf(lazy, config, i)
            else:
                params = hf_names.layer_params_from_hf(lazy, config, i)
            _write(writer, params, choose, lazy)
            progress(next(step), total, f"layer {i}")
        if groups["layers"]:
            raise ArtifactError(f"tensors of layers beyond {layers}: {sorted(groups['layers'])}")
        if groups["mtp"]:
            lazy = LazyTensors(checkpoint, groups["mtp"])
            _write(writer, hf_names.mtp_params_from_hf(lazy, config), choose, lazy)
            progress(next(step), total, "mtp")
        if vision:
            _vision(checkpoint, writer, vision, groups["vision"], choose,
                    lambda what: progress(next(step), total, what))
        if drafter is not None:
            _dflash(drafter, writer, components[kind]["config"], choose, config["vocab_size"])
            progress(next(step), total, f"{kind} drafter")
    return dst


def _dflash_config(drafter: HfCheckpoint, text: dict) -> dict:
    """The drafter's component config, refused in one line where it cannot serve `text`."""
    arch = (drafter.config.get("architectures") or ["?"])[0]
    if arch not in dflash_names.BACKENDS:
        raise ArtifactError(f'the DFlash checkpoint is "{arch}", not '
                            f"{' or '.join(dflash_names.BACKENDS)}", drafter.folder)
    config = dflash_names.component_config(drafter.config)
    why = dflash_names.mismatch(config, text)
    if why is not None:
        raise ArtifactError(f"the DFlash checkpoint {why}", drafter.folder)
    return config


def _dflash(drafter: HfCheckpoint, writer, config: dict, choose, vocab: int) -> None:
    """The drafter's tensors under their logical names, one read at a time, shape-checked."""
    names, kind = {}, dflash_names.backend(config)
    for full in drafter.names:
        try:
            logical = dflash_names.logical_name(full, kind)
        except ArtifactError as error:
            raise error.at(drafter.folder) from None
        if logical is not None:
            names[logical] = full
    shapes = dflash_names.parameter_shapes(config, vocab)
    missing = [n for n in shapes if n not in names]
    if missing:
        raise ArtifactError(f"the DFlash checkpoint lacks {len(missing)} tensors, e.g. "
                            f'"{missing[0]}"', drafter.folder)
    for logical, shape in shapes.items():
        tensor = drafter.tensor(names[logical]).contiguous()
        if tuple(tensor.shape) != shape:
            raise ArtifactError(f"{names[logical]} has shape {list(tensor.shape)}, the "
                                f"config implies {list(shape)}", drafter.folder)
        writer.add_tensor(logical, tensor, choose(logical, shape))


def _vision_config(hf_config: dict, tensors: dict) -> dict | None:
    """The vision component's config, or None for a checkpoint without a vision tower."""
    if not tensors["top"] and not tensors["blocks"]:
        return None
    if not hf_config.get("vision_config"):
        raise ArtifactError("the checkpoint has a vision tower but config.json has no "
                            "vision_config; pass --skip-vision to convert text (and MTP) only")
    return hf_vision_names.vision_config_from_hf(hf_config)


def _vision(checkpoint, writer, config: dict, tensors: dict, choose, progress) -> None:
    """The vision tower block by block, then its embeddings and merger, shape-checked."""
    shapes = hf_vision_names.vision_shapes(config)
    blocks = dict(tensors["blocks"])
    for b in range(config["depth"]):
        lazy = LazyTensors(checkpoint, blocks.pop(b, {}))
        _write(writer, hf_vision_names.vision_block_from_hf(lazy, b), choose, lazy, shapes)
        progress(f"vision block {b}")
    if blocks:
        raise ArtifactError(f"tensors of vision blocks beyond {config['depth']}: {sorted(blocks)}")
    lazy = LazyTensors(checkpoint, tensors["top"])
    _write(writer, hf_vision_names.vision_globals_from_hf(lazy), choose, lazy, shapes)
    progress("vision embeddings and merger")


def _group(names: list[str]) -> dict:
    """Checkpoint names by destination: top-level text, per text layer, MTP, vision (top-level
    and per block)."""
    groups: dict = {"top": {}, "layers": {}, "mtp": {}, "vision": {"top": {}, "blocks": {}}}
    for full in names:
        prefix = next((p for p in _VISION_PREFIXES if full.startswith(p)), None)
        if prefix:
            short = full[len(prefix):]
            block = _BLOCK.match(short)
            if block:
                groups["vision"]["blocks"].setdefault(int(block.group(1)), {})[short] = full
            else:
                groups["vision"]["top"][short] = full
        elif full.startswith("mtp."):
            groups["mtp"][full[len("mtp."):]] = full
        elif full == "lm_head.weight":
            groups["top"][full] = full
        else:
            short = next((full[len(p):] for p in ("model.language_model.", "model.")
                          if full.startswith(p)), None)
            if short is None:
                raise ArtifactError(f"unexpected tensor {full}")
            layer = _LAYER.match(short)
            if layer:
                groups["layers"].setdefault(int(layer.group(1)), {})[short] = full
            else:
                groups["top"][short] = full
    return groups


def _globals(checkpoint, writer, config, top: dict, choose) -> None:
    """Embedding and head in row blocks; the final norm; the head aliases a tied embedding."""
    top = dict(top)
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    shape = (vocab, hidden)
    embedding = top.pop("embed_tokens.weight")
    _check_shape(checkpoint, embedding, shape)
    writer.add_rows("text/token_embedding", shape, choose("text/token_embedding", shape),
                    checkpoint.row_blocks(embedding))
    writer.add_tensor("text/final_norm", checkpoint.tensor(top.pop("norm.weight")),
                      choose("text/final_norm", (hidden,)))
    head = top.pop("lm_head.weight", None)
    if config["tie_word_embeddings"]:
        writer.add_alias("text/output_head", "text/token_embedding")
    elif head is None:
        raise ArtifactError("untied checkpoint without lm_head.weight")
    else:
        _check_shape(checkpoint, head, shape)
        writer.add_rows("text/output_head", shape, choose("text/output_head", shape),
                        checkpoint.row_blocks(head))
    if top:
        raise ArtifactError(f"unexpected tensors: {sorted(top.values())[:8]}")


def _check_shape(checkpoint, name: str, shape: tuple[int, ...]) -> None:
    if checkpoint.shape(name) != shape:
        raise ArtifactError(f"{name} has shape {list(checkpoint.shape(name))}, "
                            f"the config implies {list(shape)}")


def _write(writer, params: dict, choose, lazy: LazyTensors, shapes: dict | None = None) -> None:
    """Encode and append each logical tensor, dropping it as soon as it is written; with
    ``shapes`` (logical name -> shape), each tensor's shape is checked first."""
    if lazy.left():
        raise ArtifactError(f"unexpected tensors: {lazy.left()[:8]}")
    for logical in list(params):
        tensor = params.pop(logical).contiguous()
        if shapes is not None and tuple(tensor.shape) != shapes[logical]:
            raise ArtifactError(f"{logical} has shape {list(tensor.shape)}, "
                                f"the config implies {list(shapes[logical])}")
        writer.add_tensor(logical, tensor, choose(logical, tuple(tensor.shape)))
