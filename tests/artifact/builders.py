"""Builders for artifact tests: a small valid file and a directory rewriter."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ninfer_engine.artifact import framing
from ninfer_engine.artifact.writer import ArtifactWriter

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}


def sample_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "fused": torch.randn(64, 130, generator=generator),
        "norm": torch.randn(8, generator=generator),
        "emb": torch.randn(4, 8, generator=generator),
        "ids": torch.arange(5, dtype=torch.int32),
    }


def write_small(path: Path, tensors: dict[str, torch.Tensor], **writer_options) -> Path:
    """A file with every binding kind: whole objects, parts across parents, an alias, resources."""
    with ArtifactWriter(
        path,
        metadata={"name": "tiny-model"},
        components={"text": {"config": CONFIG}},
        **writer_options,
    ) as writer:
        writer.add_resource("tokenizer.json", b'{"version": "1.0"}')
        writer.add_resource("chat_template.jinja", "{{ messages }} é".encode())
        fused = writer.add_tensor("text/fused", tensors["fused"], "q5_g64_fp16")
        writer.add_tensor("text/final_norm", tensors["norm"], "fp32")
        emb = writer.add_tensor("text/token_embedding", tensors["emb"], "bf16")
        writer.add_tensor("proposal/token_ids", tensors["ids"], "int32")
        writer.add_parts_binding("text/layers/0/attention/key", [(fused, 2 * 130, 4 * 130)])
        writer.add_parts_binding("text/mixed", [(fused, 5 * 130, 6 * 130), (emb, 3, 11)])
        writer.add_alias("text/output_head", "text/token_embedding")
    return path


def rewrite_json(path: Path, edit) -> None:
    """Re-frame ``path`` around ``edit(json_text) -> json_text``, keeping the payload."""
    data = path.read_bytes()
    _, json_bytes, raw_id = framing.HEADER.unpack(data[:32])
    payload = data[framing.payload_start(json_bytes) :]
    raw = edit(data[32 : 32 + json_bytes].decode()).encode()
    head = framing.HEADER.pack(framing.MAGIC, len(raw), raw_id) + raw
    path.write_bytes(head.ljust(framing.payload_start(len(raw)), b"\0") + payload)


def rewrite_root(path: Path, edit) -> None:
    """Re-frame ``path`` after ``edit(root)`` mutated its parsed directory."""

    def on_text(text: str) -> str:
        root = json.loads(text)
        edit(root)
        return json.dumps(root)

    rewrite_json(path, on_text)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


def _wrong_magic(path):
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + path.read_bytes()[8:])


def _text(edit):
    return lambda path: rewrite_json(path, edit)


def _root(edit):
    return lambda path: rewrite_root(path, edit)


def _object(index, **changes):
    return _root(lambda root: root["objects"][index].update(changes))


# name → (damage(path), text the one-line error must contain)
CORRUPTIONS = {
    "wrong magic": (_wrong_magic, "wrong magic"),
    "truncated": (_truncate, "truncated"),
    "header only": (lambda p: p.write_bytes(p.read_bytes()[:20]), "truncated"),
    "broken json": (_text(lambda text: text[:-3] + "]]]"), "broken JSON"),
    "duplicate key": (
        _text(lambda text: text.replace('{"components"', '{"uses":[],"components"', 1)),
        'duplicate JSON key "uses"',
    ),
    "nan": (
        _text(lambda text: text.replace('"name":"tiny-model"', '"name":"x","score":NaN')),
        "non-finite",
    ),
    "unknown root member": (_root(lambda root: root.update(extra=1)), "unknown member(s) extra"),
    "unaligned tensor": (_object(2, offset=4000), "not 256-aligned"),
    "overlap": (_object(3, offset=0), "overlaps"),
    "past payload": (_object(5, offset=1 << 20), "past the payload"),
    "wrong bytes": (_object(2, bytes=512), "encoded size"),
    "unknown format": (_object(2, format="q3_g64_fp16"), 'unknown format "q3_g64_fp16"'),
    "fork-only format": (_object(2, format="t2_g128_fp16"), "t2_g128_fp16"),
    "missing binding target": (
        _root(lambda root: root["bindings"].update({"text/x": {"object": "weight/999"}})),
        "weight/999",
    ),
    "no text component": (
        _root(lambda root: root["components"].update(vision=root["components"].pop("text"))),
        "text component",
    ),
}
