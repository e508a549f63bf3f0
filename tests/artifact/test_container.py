"""The v3 container: round trips through the writer and reader, and strict rejection."""

from __future__ import annotations

import json

import pytest
import torch

from ninfer_engine.artifact import ArtifactError, framing, open_artifact
from ninfer_engine.codecs import encodings

from .builders import CORRUPTIONS, write_small


def test_round_trip_of_every_binding_kind(small, tensors):
    with open_artifact(small) as artifact:
        assert artifact.version == 3 and artifact.name == "tiny-model"
        assert artifact.config()["model_type"] == "llama"
        fused = encodings.decode(
            "q5_g64_fp16", encodings.encode("q5_g64_fp16", tensors["fused"]), [64, 130]
        )
        assert torch.equal(artifact.parameter("text/fused", [64, 130]), fused)
        assert torch.equal(artifact.parameter("text/layers/0/attention/key", [2, 130]), fused[2:4])
        mixed = torch.cat([fused[5], tensors["emb"].to(torch.bfloat16).float().reshape(-1)[3:11]])
        assert torch.equal(artifact.parameter("text/mixed", [138]), mixed)
        assert torch.equal(artifact.parameter("text/final_norm", [8]), tensors["norm"])
        head = artifact.parameter("text/output_head", [4, 8], dtype=torch.bfloat16)
        assert head.dtype == torch.bfloat16 and torch.equal(head, tensors["emb"].to(torch.bfloat16))
        assert artifact.bindings["text/output_head"] == artifact.bindings["text/token_embedding"]
        assert torch.equal(
            artifact.parameter("proposal/token_ids", [5], dtype=torch.int32), tensors["ids"]
        )
        assert artifact.resource("chat_template.jinja") == "{{ messages }} é".encode()
        assert artifact.has_parameter("text/mixed") and not artifact.has_parameter("text/nope")
        assert list(artifact.objects)[:3] == [
            "resource/text/tokenizer.json",
            "resource/text/chat_template.jinja",
            "weight/000000",
        ]


def test_file_length_equation_and_alignment(small):
    data = small.read_bytes()
    _, json_bytes, _ = framing.HEADER.unpack(data[:32])
    root = json.loads(data[32 : 32 + json_bytes])
    assert len(data) == framing.payload_start(json_bytes) + root["files"][0]["payload_bytes"]
    assert all(o["offset"] % 256 == 0 for o in root["objects"] if o["kind"] == "tensor")
    assert set(root) == {"components", "objects", "bindings", "uses", "files", "metadata"}


def test_continuation_parts_and_straddling_objects(tmp_path, tensors):
    path = write_small(tmp_path / "split.ninfer", tensors, file_payload_cap=4096)
    assert (tmp_path / "split.ninfer.part-0001").exists()
    with (
        open_artifact(path) as artifact,
        open_artifact(write_small(tmp_path / "one.ninfer", tensors)) as whole,
    ):
        assert len(artifact.files) > 1
        for name in artifact.bindings:
            shape = [artifact.parameter_numel(name)]
            assert torch.equal(artifact.parameter(name, shape), whole.parameter(name, shape)), name
        assert artifact.resource("tokenizer.json") == whole.resource("tokenizer.json")


def test_continuation_from_another_artifact_is_rejected(tmp_path, tensors):
    write_small(tmp_path / "a.ninfer", tensors, file_payload_cap=4096)
    write_small(tmp_path / "b.ninfer", tensors, file_payload_cap=4096)
    (tmp_path / "a.ninfer.part-0001").write_bytes((tmp_path / "b.ninfer.part-0001").read_bytes())
    with pytest.raises(ArtifactError, match="another artifact"):
        open_artifact(tmp_path / "a.ninfer")


def test_parameter_errors_name_the_binding(small):
    with open_artifact(small) as artifact:
        with pytest.raises(ArtifactError, match='missing binding "text/nope"'):
            artifact.parameter("text/nope", [1])
        with pytest.raises(ArtifactError, match="has 260 elements"):
            artifact.parameter("text/layers/0/attention/key", [2, 131])
        with pytest.raises(ArtifactError, match='missing resource "vocab.txt"'):
            artifact.resource("vocab.txt")
    with pytest.raises(ArtifactError, match="closed"):
        artifact.parameter("text/final_norm", [8])


def test_writer_refuses_bad_bindings(tmp_path, tensors):
    from ninfer_engine.artifact import ArtifactWriter

    writer = ArtifactWriter(tmp_path / "w.ninfer", components={"text": {"config": {}}})
    oid = writer.add_tensor("text/a", tensors["norm"], "fp32")
    with pytest.raises(ArtifactError, match="outside"):
        writer.add_parts_binding("text/b", [(oid, 0, 9)])
    with pytest.raises(ArtifactError, match='missing binding "text/zzz"'):
        writer.add_alias("text/c", "text/zzz")
    with pytest.raises(ArtifactError, match="already defined"):
        writer.add_tensor("text/a", tensors["norm"], "fp32")
    writer.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_gives_one_line_error_naming_the_file(small, case):
    damage, needle = CORRUPTIONS[case]
    damage(small)
    with pytest.raises(ArtifactError) as caught:
        open_artifact(small)
    message = str(caught.value)
    assert needle in message and "\n" not in message and message.startswith(str(small))
