"""GGUF (``general.architecture == llama``) → `.ninfer` v3, the "llama" text family of §5.

Each tensor is dequantized with ``gguf.quants.dequantize``, the Q/K rows are restored from
llama.cpp's interleaved-RoPE order to HF order, and matrices are re-encoded as ``q8_g32_fp16``
(norms as ``fp32``); GGUF's Q4_1 has a zero point, which our grouped formats cannot copy.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .errors import ArtifactError
from .gguf_tokenizer import GgufVocab, resources
from .writer import ArtifactWriter

MATRIX_FORMAT = "q8_g32_fp16"
NORM_FORMAT = "fp32"
Progress = Callable[[int, int, str], None]

_LAYER_TENSORS = {
    "attn_norm": "input_norm",
    "attn_q": "attention/query",
    "attn_k": "attention/key",
    "attn_v": "attention/value",
    "attn_output": "attention/output",
    "ffn_norm": "post_attention_norm",
    "ffn_gate": "mlp/gate",
    "ffn_up": "mlp/up",
    "ffn_down": "mlp/down",
}
_MISSING = object()


def convert_gguf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    name: str | None = None,
    progress: Progress | None = None,
    sampling: dict[str, float | int] | None = None,
) -> Path:
    """Convert a llama-architecture GGUF file to ``dst``; returns ``dst``.

    ``progress(done, total, what)`` is called after each tensor (and once per resource step).
    ``sampling`` (e.g. the model card's recommended temperature and top-p, and
    ``max_new_tokens``, the default output limit) goes into the artifact's
    ``generation_config.json``, the server's model preset; GGUF files carry none.
    """
    import gguf  # imported here so that reading artifacts does not need the package

    src = Path(src)
    try:
        reader = gguf.GGUFReader(src)
    except (OSError, ValueError) as error:
        raise ArtifactError(
            f"cannot read GGUF: {getattr(error, 'strerror', None) or error}", src
        ) from None
    try:
        return _convert(gguf, reader, src, Path(dst), name, progress or (lambda *_: None),
                        sampling or {})
    except ArtifactError as error:
        raise error.at(src) from None


def _convert(gguf, reader, src: Path, dst: Path, name: str | None, progress: Progress,
             sampling: dict[str, float | int]) -> Path:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ArtifactError(f'unsupported GGUF architecture "{arch}" (only llama)')
    tensors = {t.name: t for t in reader.tensors}
    config = text_config(reader, tensors)
    vocab = gguf_vocab(reader, config["max_position_embeddings"])
    metadata = {
        "name": name or default_name(reader, src),
        "source": {"format": "gguf", "file": src.name},
    }
    plan = _tensor_plan(config, tensors)
    total = len(plan) + 1
    with ArtifactWriter(dst, metadata=metadata, components={"text": {"config": config}}) as writer:
        for role, data in resources(vocab).items():
            if role == "generation_config.json" and sampling:
                data = json.dumps({**json.loads(data), **sampling}, indent=2).encode()
            writer.add_resource(role, data)
        progress(1, total, "tokenizer and resources")
        for step, (gguf_name, binding, heads) in enumerate(plan, start=2):
            tensor = tensors[gguf_name]
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            values = np.require(
                values, np.float32, ["C", "W"]
            )  # F32 tensors come back as read-only memmaps
            if heads:
                values = unpermute_rows(values, heads)
            fmt = NORM_FORMAT if values.ndim == 1 else MATRIX_FORMAT
            writer.add_tensor(binding, torch.from_numpy(values), fmt)
            progress(step, total, gguf_name)
        if config["tie_word_embeddings"]:
            writer.add_alias("text/output_head", "text/token_embedding")
    return dst


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head Q/K row permutation (interleaved pairs → HF split halves)."""
    rows, cols = weight.shape
    head_dim = rows // heads
    return weight.reshape(heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def text_config(reader, tensors: dict) -> dict:
    """``components.text.config`` of §5 from the ``llama.*`` keys."""
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = hidden // heads
    rope_dims = int(_field(reader, "llama.rope.dimension_count", head_dim))
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if rope_dims != head_dim or scaling != "none" or "rope_freqs.weight" in tensors:
        raise ArtifactError(
            f"unsupported RoPE variant (dimensions {rope_dims} of {head_dim}, scaling {scaling})"
        )
    vocab_size = int(tensors["token_embd.weight"].shape[-1])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0))},
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": _optional_int(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _optional_int(reader, "tokenizer.ggml.eos_token_id"),
    }


def gguf_vocab(reader, max_length: int) -> GgufVocab:
    return GgufVocab(
        model=_field(reader, "tokenizer.ggml.model"),
        pre=_field(reader, "tokenizer.ggml.pre", "default"),
        tokens=list(_field(reader, "tokenizer.ggml.tokens")),
        token_types=[int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(_field(reader, "tokenizer.ggml.merges")),
        bos_id=_optional_int(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_optional_int(reader, "tokenizer.ggml.eos_token_id"),
        pad_id=_optional_int(reader, "tokenizer.ggml.padding_token_id"),
        eot_id=_optional_int(reader, "tokenizer.ggml.eot_token_id"),
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_field(reader, "tokenizer.chat_template", None),
        max_length=max_length,
    )


def default_name(reader, src: Path) -> str:
    """The file stem without its quantization tag (``SmolLM2-135M-Instruct.Q4_1`` →
    ``smollm2-135m-instruct``) when it names the model, else ``basename-size_label``."""
    base = str(_field(reader, "general.basename", "")).lower()
    stem = re.sub(r"[.-](i?q\d\w*|f16|bf16|f32)$", "", src.stem, flags=re.IGNORECASE).lower()
    if base and base in stem:
        return stem
    parts = [p for p in (base, str(_field(reader, "general.size_label", "")).lower()) if p]
    return "-".join(parts) or stem


def _tensor_plan(config: dict, tensors: dict) -> list[tuple[str, str, int]]:
    """(GGUF tensor, binding name, heads to un-permute or 0) in writing order."""
    plan = [
        ("token_embd.weight", "text/token_embedding", 0),
        ("output_norm.weight", "text/final_norm", 0),
    ]
    if not config["tie_word_embeddings"]:
        plan.append(("output.weight", "text/output_head", 0))
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for layer in range(config["num_hidden_layers"]):
        for short, binding in _LAYER_TENSORS.items():
            plan.append(
                (
                    f"blk.{layer}.{short}.weight",
                    f"text/layers/{layer}/{binding}",
                    heads.get(short, 0),
                )
            )
    missing = [gguf_name for gguf_name, _, _ in plan if gguf_name not in tensors]
    if missing:
        raise ArtifactError(f"GGUF lacks tensor(s) {', '.join(missing[:3])}")
    return plan


def _field(reader, key: str, default: object = _MISSING) -> object:
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ArtifactError(f"GGUF lacks metadata key {key}")
        return default
    return field.contents()


def _optional_int(reader, key: str) -> int | None:
    value = _field(reader, key, None)
    return None if value is None else int(value)
