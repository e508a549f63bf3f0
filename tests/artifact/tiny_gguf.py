"""A tiny llama GGUF (2 layers, hidden 64, a 262-token byte-level BPE vocabulary, a chat
template): the whole GGUF pipeline, and a model `ninfer-serve` loads in a second."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 2, 1, 96, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_chars() -> list[str]:
    """GPT-2's byte → printable-character table (the byte-level BPE alphabet)."""
    kept = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(extra)) for b in range(256)]


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's HF → GGUF Q/K row permutation (``LlamaModel.permute``)."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    """Write the tiny GGUF at ``path``; returns the HF-order weights it was built from."""
    tokens = SPECIALS + _byte_chars() + ["Ġt", "he", "Ġthe"]
    rng = np.random.default_rng(0)
    hf = {
        "token_embd.weight": rng.standard_normal((len(tokens), HIDDEN)).astype(np.float32),
        "output_norm.weight": rng.standard_normal(HIDDEN).astype(np.float32),
    }
    shapes = {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
        "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (FFN, HIDDEN),
        "ffn_up": (FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
        "attn_norm": (HIDDEN,),
        "ffn_norm": (HIDDEN,),
    }
    for layer in range(LAYERS):
        for short, shape in shapes.items():
            hf[f"blk.{layer}.{short}.weight"] = rng.standard_normal(shape).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_basename("tiny")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
    )
    for name, weight in hf.items():
        heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(name.split(".")[-2], 0)
        stored = _permute(weight, heads) if heads else weight
        if name == "token_embd.weight":
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


def convert_tiny(folder: Path) -> Path:
    """`folder/tiny.ninfer`, converted by the real `ninfer convert gguf` from the tiny GGUF."""
    from ninfer_engine.cli.tools import main as ninfer

    write_tiny_gguf(folder / "tiny.gguf")
    assert ninfer(["convert", "gguf", str(folder / "tiny.gguf"), "-o",
                   str(folder / "tiny.ninfer")]) == 0
    return folder / "tiny.ninfer"
