"""The ``ninfer`` command: inspect output and one-line errors with exit status 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ninfer_engine.cli.tools import main

from .builders import CORRUPTIONS


def test_inspect_reports_formats_bindings_and_components(small, capsys):
    assert main(["inspect", str(small)]) == 0
    out = capsys.readouterr().out
    assert "name: tiny-model" in out and "component text: LlamaForCausalLM (llama)" in out
    assert "q5_g64_fp16" in out and "bindings: 7" in out


def test_inspect_json(small, capsys):
    assert main(["inspect", "--json", str(small)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["version"] == 3 and info["name"] == "tiny-model"
    assert info["objects"]["formats"]["fp32"] == {"count": 1, "bytes": 32}
    assert info["bindings"] == {
        "count": 7,
        "whole_object": 5,
        "parts": 2,
        "sharing_an_object": 2,
        "by_component": {"text": 6, "proposal": 1},
    }
    assert info["components"]["text"]["resources"] == ["chat_template.jinja", "tokenizer.json"]


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_inspect_of_a_broken_file_is_one_line_and_exit_1(small, case, capsys):
    CORRUPTIONS[case][0](small)
    assert main(["inspect", str(small)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ninfer: error: {small}: ")


def test_module_entry_point_prints_no_traceback(tmp_path):
    bogus = tmp_path / "bogus.ninfer"
    bogus.write_bytes(b"not an artifact at all, definitely more than 32 bytes")
    run = subprocess.run(
        [sys.executable, "-m", "ninfer_engine.cli.tools", "inspect", str(bogus)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert (
        run.stderr.strip()
        == f"ninfer: error: {bogus}: not a .ninfer file (wrong magic 6e 6f 74 20 61 6e 20 61)"
    )


def test_convert_of_a_missing_gguf_fails_in_one_line(tmp_path, capsys):
    assert (
        main(["convert", "gguf", str(tmp_path / "absent.gguf"), "-o", str(tmp_path / "x.ninfer")])
        == 1
    )
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ninfer: error: ") and "absent.gguf" in err[0]


def test_bench_without_cuda_fails_in_one_line(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    assert main(["bench", "--arch", "tiny-dense", "--context", "64"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["ninfer: error: ninfer bench needs a CUDA device"]


@pytest.mark.parametrize("argv", [["bench", "--arch", "70b"], [],
                                  ["synth", "--arch", "tiny-moe", "-o", "x.ninfer", "--device",
                                   "gpu"]])
def test_wrong_flags_are_one_line_and_exit_1(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 1 and len(err) == 1 and err[0].startswith("ninfer")
    assert ": error: " in err[0] and "--help" in err[0]
