"""Payload digests and atomic publication: `metadata.payload_sha256`, `ninfer inspect --verify`,
and writers that never share or half-publish a file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer_engine.artifact import ArtifactError, ArtifactWriter, framing, open_artifact, verify
from ninfer_engine.cli.tools import main

from .builders import CONFIG, rewrite_root, write_small
from .tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]


def payload_start(path: Path) -> int:
    return framing.payload_start(framing.HEADER.unpack(path.read_bytes()[:32])[1])


def flip(path: Path, offset: int) -> None:
    """Flip one bit of the byte at ``offset`` (in place)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x01]))


def ninfer(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ninfer_engine.cli.tools", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "Tiny-Chat.Q8_0.gguf"
    write_tiny_gguf(path)
    return path


# -- what the digest covers ----------------------------------------------------------------------

def test_digest_covers_every_byte_after_the_directory(small):
    with open_artifact(small) as artifact:
        recorded = artifact.metadata[verify.DIGEST_KEY]
    data = small.read_bytes()
    assert recorded == hashlib.sha256(data[payload_start(small):]).hexdigest()
    assert verify.file_sha256(small) == hashlib.sha256(data).hexdigest()


def test_digest_covers_continuation_payloads_in_order(tmp_path, tensors):
    path = write_small(tmp_path / "split.ninfer", tensors, file_payload_cap=4096)
    parts = sorted(tmp_path.glob("split.ninfer.part-*"))
    assert parts
    payload = path.read_bytes()[payload_start(path):]
    payload += b"".join(part.read_bytes()[framing.PAYLOAD_ALIGNMENT:] for part in parts)
    with open_artifact(path) as artifact:
        assert artifact.metadata[verify.DIGEST_KEY] == hashlib.sha256(payload).hexdigest()
        assert verify.check_payload(artifact) == hashlib.sha256(payload).hexdigest()
    flip(parts[-1], os.path.getsize(parts[-1]) - 1)
    with open_artifact(path) as artifact, pytest.raises(ArtifactError, match="does not match"):
        verify.check_payload(artifact)


def test_writer_keeps_the_callers_metadata_and_adds_the_digest(small):
    with open_artifact(small) as artifact:
        assert artifact.name == "tiny-model"
        assert set(artifact.metadata) == {"name", verify.DIGEST_KEY}


@pytest.mark.parametrize("value", ["", "ABCD" * 16, "0" * 63, 7])
def test_a_malformed_digest_field_is_refused(small, value):
    rewrite_root(small, lambda root: root["metadata"].update({verify.DIGEST_KEY: value}))
    with pytest.raises(ArtifactError, match="payload_sha256 must be 64 lowercase hex"):
        open_artifact(small)


@pytest.mark.parametrize("where", ["first byte", "inside a tensor", "alignment gap", "last byte"])
def test_any_flipped_payload_byte_is_a_mismatch(small, where):
    start, size = payload_start(small), os.path.getsize(small)
    with open_artifact(small) as artifact:
        objects = sorted(artifact.objects.values(), key=lambda o: o.offset)
    gap = next(a.offset + a.bytes for a, b in zip(objects, objects[1:])
               if a.offset + a.bytes < b.offset)
    offset = {"first byte": start, "inside a tensor": start + objects[2].offset + 5,
              "alignment gap": start + gap, "last byte": size - 1}[where]
    flip(small, offset)
    with open_artifact(small) as artifact:  # the structure is still valid
        with pytest.raises(ArtifactError) as caught:
            verify.check_payload(artifact)
    message = str(caught.value)
    assert message.startswith(f"{small}: payload digest does not match") and "\n" not in message


# -- ninfer inspect --verify ---------------------------------------------------------------------

def test_inspect_verify_reports_a_good_digest(small, capsys):
    assert main(["inspect", "--verify", str(small)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("payload digest verified: SHA-256 ")
    assert main(["inspect", "--verify", "--json", str(small)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["verification"]["status"] == "payload_sha256"


def test_inspect_verify_of_a_flipped_byte_is_one_line_and_exit_1(small):
    flip(small, os.path.getsize(small) - 100)
    assert ninfer("inspect", str(small)).returncode == 0  # the structure alone looks fine
    run = ninfer("inspect", "--verify", str(small))
    assert run.returncode == 1 and run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"ninfer: error: {small}: payload digest does not match")


def test_inspect_verify_without_a_digest_says_so(small, capsys):
    rewrite_root(small, lambda root: root["metadata"].pop(verify.DIGEST_KEY))
    assert main(["inspect", "--verify", str(small)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("no digest recorded")


def test_inspect_verify_checks_a_published_file_by_its_whole_file_sha256(
        small, monkeypatch, capsys):
    rewrite_root(small, lambda root: root["metadata"].pop(verify.DIGEST_KEY))
    whole, size = verify.file_sha256(small), os.path.getsize(small)
    monkeypatch.setattr(verify, "PUBLISHED", (verify.Published("official.ninfer", 3, size, whole),))
    assert main(["inspect", "--verify", str(small)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"no digest recorded; whole-file SHA-256 {whole} matches the published official.ninfer")
    flip(small, size - 1)
    assert main(["inspect", "--verify", str(small)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "does not match the published" in err[0] and str(small) in err[0]


def test_published_table_holds_the_model_cards_files():
    sizes = {entry.name: (entry.version, entry.size, entry.sha256[:8])
             for entry in verify.PUBLISHED}
    assert sizes == {"qwen3_6_27b.ninfer": (1, 17_495_365_888, "74fac75f"),
                     "qwen3_6_35b_a3b.ninfer": (1, 22_783_246_080, "5194407d")}


# -- atomic publication --------------------------------------------------------------------------

def test_a_failed_writer_leaves_the_old_target_and_no_temporaries(small, tensors):
    before = small.read_bytes()
    with pytest.raises(ArtifactError):
        with ArtifactWriter(small, components={"text": {"config": CONFIG}}) as writer:
            writer.add_tensor("text/final_norm", tensors["norm"], "fp32")
            assert len(list(small.parent.glob("small.ninfer.*.payload.tmp"))) == 1
            writer.add_tensor("text/final_norm", tensors["norm"], "fp32")  # already defined
    assert small.read_bytes() == before
    assert sorted(p.name for p in small.parent.iterdir()) == ["small.ninfer"]


def test_a_publication_that_fails_midway_removes_its_temporaries(tmp_path, tensors, monkeypatch):
    import ninfer_engine.artifact.writer as writer_module

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_module.os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_small(tmp_path / "x.ninfer", tensors, file_payload_cap=4096)
    assert list(tmp_path.iterdir()) == []


def test_interleaved_writers_of_one_target_each_publish_a_whole_artifact(tmp_path, tensors):
    """The old writers shared `X.payload.tmp`: interleaved, they corrupted each other."""
    target = tmp_path / "same.ninfer"
    first = ArtifactWriter(target, metadata={"name": "first"},
                           components={"text": {"config": CONFIG}})
    second = ArtifactWriter(target, metadata={"name": "second"},
                            components={"text": {"config": CONFIG}})
    for i, writer in enumerate([first, second, first, second]):
        writer.add_tensor(f"text/t{i // 2}", tensors["fused"] * (i + 1), "q8_g32_fp16")
    first.close()
    with open_artifact(target) as artifact:
        assert artifact.name == "first" and verify.check_payload(artifact)
    second.close()
    with open_artifact(target) as artifact:
        assert artifact.name == "second" and verify.check_payload(artifact)
    assert [p.name for p in tmp_path.iterdir()] == ["same.ninfer"]


def test_two_conversions_to_the_same_output_at_once(tiny_gguf, tmp_path):
    """Two real `ninfer convert gguf` processes, started together, writing one target."""
    out = tmp_path / "model.ninfer"
    command = [sys.executable, "-m", "ninfer_engine.cli.tools", "convert", "gguf", str(tiny_gguf),
               "-o", str(out)]
    procs = [subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    for code, _, err in results:
        assert code == 0, err
    verified = ninfer("inspect", "--verify", str(out))
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.splitlines()[-1].startswith("payload digest verified")
    assert [p.name for p in tmp_path.iterdir()] == ["model.ninfer"]  # no temporaries left


def test_conversion_into_a_missing_directory_fails_in_one_line(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "absent" / "x.ninfer"
    assert main(["convert", "gguf", str(tiny_gguf), "-o", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"ninfer: error: {out}: cannot write in {out.parent}: "
                   "No such file or directory"]


def test_background_check_closes_the_artifact_on_a_mismatch(small):
    """The engine's load-time check: a mismatch closes the artifact (the load's next read
    fails at once) and `result()` raises the one-line mismatch."""
    good = open_artifact(small)
    verify.BackgroundCheck(good, on_mismatch=good.close).result()
    assert good.parameter("text/final_norm", [8]).shape == (8,)  # still open
    flip(small, os.path.getsize(small) - 1)
    bad = open_artifact(small)
    check = verify.BackgroundCheck(bad, on_mismatch=bad.close)
    with pytest.raises(ArtifactError, match="payload digest does not match"):
        check.result()
    with pytest.raises(ArtifactError, match="closed"):
        bad.parameter("text/final_norm", [8])
    good.close()
