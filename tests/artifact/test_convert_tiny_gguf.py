"""GGUF → .ninfer on a tiny synthetic llama GGUF: the whole pipeline without the real model."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

from ninfer_engine.artifact import open_artifact
from ninfer_engine.cli.tools import main

from .tiny_gguf import HIDDEN, LAYERS, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path of a converted tiny GGUF, the HF-order weights it was built from)."""
    folder = tmp_path_factory.mktemp("tiny")
    hf = write_tiny_gguf(folder / "Tiny-Chat.Q8_0.gguf")
    out = folder / "tiny.ninfer"
    assert main(["convert", "gguf", str(folder / "Tiny-Chat.Q8_0.gguf"), "-o", str(out)]) == 0
    return out, hf


def _q8_step(weight: torch.Tensor) -> torch.Tensor:
    padded = torch.nn.functional.pad(weight, (0, -weight.shape[1] % 128))
    step = padded.view(weight.shape[0], -1, 32).abs().amax(-1) / 127
    return step.repeat_interleave(32, 1)[:, : weight.shape[1]]


def test_tiny_conversion_restores_hf_order_and_ties_the_head(tiny):
    path, hf = tiny
    with open_artifact(path) as artifact:
        assert artifact.name == "tiny-chat"
        config = artifact.config()
        assert (
            config["head_dim"],
            config["num_key_value_heads"],
            config["tie_word_embeddings"],
        ) == (32, 1, True)
        for layer in range(LAYERS):
            for short, binding in (
                ("attn_q", "attention/query"),
                ("attn_k", "attention/key"),
                ("ffn_down", "mlp/down"),
            ):
                expected = torch.from_numpy(hf[f"blk.{layer}.{short}.weight"])
                actual = artifact.parameter(f"text/layers/{layer}/{binding}", list(expected.shape))
                assert bool(
                    ((actual - expected).abs() <= _q8_step(expected) * 0.51 + 1e-7).all()
                ), (layer, short)
            norm = torch.from_numpy(hf[f"blk.{layer}.attn_norm.weight"])
            assert torch.equal(
                artifact.parameter(f"text/layers/{layer}/input_norm", [HIDDEN]), norm
            )
        embedding = artifact.parameter("text/token_embedding", [config["vocab_size"], HIDDEN])
        assert torch.equal(
            artifact.parameter("text/output_head", [config["vocab_size"], HIDDEN]), embedding
        )
        assert float((embedding - torch.from_numpy(hf["token_embd.weight"])).abs().max()) < 0.05


def test_tiny_tokenizer_and_resources(tiny):
    with open_artifact(tiny[0]) as artifact:
        tokenizer = Tokenizer.from_str(artifact.resource("tokenizer.json").decode())
        encoding = tokenizer.encode("<|im_start|> the 42<|im_end|>")
        assert encoding.tokens == ["<|im_start|>", "Ġthe", "Ġ", "4", "2", "<|im_end|>"]
        assert tokenizer.decode(tokenizer.encode("naïve ☃ 7").ids) == "naïve ☃ 7"
        assert json.loads(artifact.resource("generation_config.json"))["eos_token_id"] == [2]
        assert artifact.resource("chat_template.jinja").startswith(b"{% for m in messages %}")


def test_name_override(tiny, tmp_path):
    src = tiny[0].parent / "Tiny-Chat.Q8_0.gguf"
    assert (
        main(["convert", "gguf", str(src), "-o", str(tmp_path / "n.ninfer"), "--name", "my-model"])
        == 0
    )
    with open_artifact(tmp_path / "n.ninfer") as artifact:
        assert artifact.name == "my-model"


def test_sampling_preset_reaches_generation_config(tiny, tmp_path):
    src = tiny[0].parent / "Tiny-Chat.Q8_0.gguf"
    out = tmp_path / "s.ninfer"
    assert main(["convert", "gguf", str(src), "-o", str(out),
                 "--sampling", "temperature=0.2,top_p=0.9,top_k=40"]) == 0
    with open_artifact(out) as artifact:
        config = json.loads(artifact.resource("generation_config.json"))
    assert (config["temperature"], config["top_p"], config["top_k"]) == (0.2, 0.9, 40)
    assert config["eos_token_id"] == [2]


def test_sampling_preset_rejects_unknown_keys(tiny, tmp_path, capsys):
    src = tiny[0].parent / "Tiny-Chat.Q8_0.gguf"
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "gguf", str(src), "-o", str(tmp_path / "x.ninfer"), "--sampling", "heat=1"])
    assert exit_info.value.code != 0
    assert "unknown generation key 'heat'" in capsys.readouterr().err
