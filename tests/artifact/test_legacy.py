"""Legacy v1/v2 files open through the upgrade shim (upstream's v2 → v3 mapping)."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from ninfer_engine.artifact import ArtifactError, open_artifact
from ninfer_engine.codecs import encodings


def write_legacy(path, version: int, root: dict, entries: list[tuple[dict, bytes | int]]) -> None:
    """A v1/v2 file; an int instead of bytes leaves that many zero bytes as a sparse hole."""
    objects, offset, chunks = [], 0, []
    for entry, data in entries:
        if entry["kind"] == "tensor":
            offset = -(-offset // 256) * 256
        size = data if isinstance(data, int) else len(data)
        objects.append({**entry, "offset": offset, "bytes": size})
        chunks.append((offset, data))
        offset += size
    text = json.dumps({**root, "objects": objects}).encode()
    start = -(-(16 + len(text)) // 4096) * 4096
    with open(path, "wb") as out:
        out.write(b"NINFER\0" + bytes([version]) + struct.pack("<Q", len(text)) + text)
        for at, data in chunks:
            if not isinstance(data, int):
                out.seek(start + at)
                out.write(data)
        out.truncate(start + offset)


def _tensor(name, shape, fmt, layout):
    return {"name": name, "kind": "tensor", "shape": shape, "format": fmt, "layout": layout}


@pytest.fixture
def v2_file(tmp_path):
    torch.manual_seed(0)
    a_b = torch.randn(96, 5120)
    norm = torch.randn(5120)
    entries = [
        (
            {"name": "frontend/tokenizer.json", "kind": "resource", "encoding": "raw-bytes-v1"},
            b'{"model": {}}',
        ),
        (
            _tensor(
                "text/layers/0/gdn/a_b_projection", [96, 5120], "W8G32_F16S", "row-split-k128-v1"
            ),
            encodings.encode("q8_g32_fp16", a_b),
        ),
        (
            _tensor(
                "text/layers/3/attention/query_key", [7168, 5120], "Q4G64_F16S", "row-split-k128-v1"
            ),
            19_496_960,
        ),
        (
            _tensor("mtp/layer/input_norm", [5120], "FP32", "contiguous-le-v1"),
            encodings.encode("fp32", norm),
        ),
    ]
    path = tmp_path / "old.ninfer"
    write_legacy(
        path, 2, {"identity": {"model_id": "qwen3.6-27b", "weights_id": "groupwise-int"}}, entries
    )
    return path, a_b, norm


def test_v2_file_opens_with_v3_bindings(v2_file):
    path, a_b, norm = v2_file
    with open_artifact(path) as artifact:
        assert (
            artifact.version == 2
            and artifact.name == "qwen3.6-27b"
            and artifact.artifact_id is None
        )
        assert artifact.config()["hidden_size"] == 5120 and artifact.config("vision")["depth"] == 27
        assert artifact.provenance == {
            "upgraded_from": {
                "version": 2,
                "model_id": "qwen3.6-27b",
                "weights_id": "groupwise-int",
            }
        }
        decoded = encodings.decode("q8_g32_fp16", encodings.encode("q8_g32_fp16", a_b), [96, 5120])
        assert torch.equal(
            artifact.parameter("text/layers/0/gdn/b_projection", [48, 5120]), decoded[48:]
        )
        assert torch.equal(
            artifact.parameter("text/layers/0/gdn/a_projection", [48, 5120]), decoded[:48]
        )
        assert torch.equal(artifact.parameter("mtp/layers/0/input_norm", [5120]), norm)
        assert artifact.bindings["text/layers/3/attention/key"][0].begin == 6144 * 5120
        assert artifact.parameter("text/layers/3/attention/key", [1024, 5120]).abs().sum() == 0
        assert artifact.resource("tokenizer.json") == b'{"model": {}}'


def test_v1_moe_router_and_shared_score_split(tmp_path):
    router = torch.randn(257, 2048)
    entries = [
        (
            _tensor(
                "text/layers/5/moe/router_shared_gate", [257, 2048], "BF16", "contiguous-le-v1"
            ),
            encodings.encode("bf16", router),
        )
    ]
    path = tmp_path / "v1.ninfer"
    write_legacy(path, 1, {"model_id": "qwen3.6-35b-a3b"}, entries)
    with open_artifact(path) as artifact:
        assert artifact.version == 1 and artifact.config()["num_experts"] == 256
        expected = router.to(torch.bfloat16).float()
        assert torch.equal(
            artifact.parameter("text/layers/5/moe/shared_score", [1, 2048]), expected[256:]
        )
        assert torch.equal(
            artifact.parameter("text/layers/5/moe/router", [256, 2048]), expected[:256]
        )


@pytest.mark.parametrize(
    ("root", "entry", "needle"),
    [
        (
            {"identity": {"model_id": "llama-7b", "weights_id": "groupwise-int"}},
            None,
            "unknown legacy v2 model",
        ),
        (
            None,
            _tensor("text/layers/0/attention/qkv", [8, 5120], "BF16", "contiguous-le-v1"),
            "unknown legacy decoder",
        ),
        (None, _tensor("text/final_norm", [4096], "FP32", "contiguous-le-v1"), "expected [5120]"),
        (None, _tensor("text/final_norm", [5120], "Q3", "contiguous-le-v1"), "unknown format"),
        (
            {"identity": {"model_id": "qwen3.6-27b", "weights_id": "groupwise-int"}, "extra": 1},
            None,
            "exactly",
        ),
    ],
)
def test_legacy_errors_are_one_line(tmp_path, root, entry, needle):
    root = root or {"identity": {"model_id": "qwen3.6-27b", "weights_id": "groupwise-int"}}
    entry = entry or _tensor("text/final_norm", [5120], "FP32", "contiguous-le-v1")
    path = tmp_path / "bad.ninfer"
    write_legacy(path, 2, root, [(entry, 64 * 1024)])
    with pytest.raises(ArtifactError) as caught:
        open_artifact(path)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
