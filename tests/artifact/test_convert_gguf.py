"""GGUF → .ninfer on the real default model (skipped when the file is absent)."""

from __future__ import annotations

import json
import re

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from ninfer_engine.artifact import ArtifactError, open_artifact
from ninfer_engine.artifact.convert_gguf import convert_gguf, unpermute_rows
from ninfer_engine.cli.flags import ninfer_home
from ninfer_engine.cli.tools import main

# where install.sh downloads it
GGUF_PATH = ninfer_home() / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_gguf = pytest.mark.skipif(
    not GGUF_PATH.exists(),
    reason=f"default model GGUF not present at {GGUF_PATH} (run ./install.sh)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(artifact, the converter's own GGUFReader, progress calls), converted once per module."""
    if not GGUF_PATH.exists():
        pytest.skip(f"default model GGUF not present at {GGUF_PATH}")
    readers, calls = [], []

    class RecordingReader(
        gguf.GGUFReader
    ):  # reuse the converter's reader: parsing GGUF metadata takes seconds
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            readers.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", RecordingReader)
        path = convert_gguf(
            GGUF_PATH,
            tmp_path_factory.mktemp("gguf") / "smol.ninfer",
            progress=lambda *call: calls.append(call),
        )
    with open_artifact(path) as artifact:
        yield artifact, readers[0], calls


def _dequantized(reader, name: str) -> np.ndarray:
    tensor = next(t for t in reader.tensors if t.name == name)
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type)


@needs_gguf
def test_config_name_and_progress(converted):
    artifact, _, calls = converted
    assert artifact.name == "smollm2-135m-instruct"
    assert artifact.config() == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rms_norm_eps": pytest.approx(1e-5),
        "rope_parameters": {"rope_theta": 100000.0},
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert [c[0] for c in calls] == list(range(1, len(calls) + 1)) and calls[-1][0] == calls[-1][1]


@needs_gguf
def test_resources(converted):
    artifact, reader, _ = converted
    generation = json.loads(artifact.resource("generation_config.json"))
    assert generation["eos_token_id"] == [2] and generation["bos_token_id"] == 1
    config = json.loads(artifact.resource("tokenizer_config.json"))
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == (
        "<|im_start|>",
        "<|im_end|>",
        False,
    )
    assert config["added_tokens_decoder"]["2"]["content"] == "<|im_end|>"
    template = artifact.resource("chat_template.jinja").decode()
    assert template == reader.fields["tokenizer.chat_template"].contents()


@needs_gguf
def test_tokenizer_specials_and_unicode(converted):
    tokenizer = Tokenizer.from_str(converted[0].resource("tokenizer.json").decode())
    encoding = tokenizer.encode("<|im_start|>user\nWhat is 2+2?<|im_end|>")
    assert encoding.tokens == [
        "<|im_start|>",
        "user",
        "Ċ",
        "What",
        "Ġis",
        "Ġ",
        "2",
        "+",
        "2",
        "?",
        "<|im_end|>",
    ]
    assert encoding.ids[0] == 1 and encoding.ids[-1] == 2
    text = "Grüße, naïve café — 日本語, emoji 😀🚀, digits 12345"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.token_to_id("<|endoftext|>") == 0


@needs_gguf
@pytest.mark.parametrize(
    ("short", "binding", "heads"),
    [("attn_q", "attention/query", 9), ("attn_k", "attention/key", 3)],
)
@pytest.mark.parametrize("layer", [0, 29])
def test_query_key_are_unpermuted_within_q8_error(converted, short, binding, heads, layer):
    artifact, reader, _ = converted
    expected = torch.from_numpy(
        unpermute_rows(_dequantized(reader, f"blk.{layer}.{short}.weight"), heads).copy()
    )
    actual = artifact.parameter(f"text/layers/{layer}/{binding}", list(expected.shape))
    step = (expected.view(expected.shape[0], -1, 32).abs().amax(-1) / 127).repeat_interleave(32, 1)
    assert bool(((actual - expected).abs() <= step * 0.5 * 1.01 + 1e-9).all())
    permuted_error = (
        actual - torch.from_numpy(_dequantized(reader, f"blk.{layer}.{short}.weight").copy())
    ).abs()
    assert float(permuted_error.max()) > 10 * float(step.max())  # the raw GGUF order really differs


@needs_gguf
def test_norms_exact_and_head_tied(converted):
    artifact, reader, _ = converted
    norm = torch.from_numpy(_dequantized(reader, "blk.7.ffn_norm.weight").copy())
    assert torch.equal(artifact.parameter("text/layers/7/post_attention_norm", [576]), norm)
    assert artifact.bindings["text/output_head"] == artifact.bindings["text/token_embedding"]
    assert sum(1 for o in artifact.objects.values() if o.kind == "tensor") == 2 + 9 * 30


@needs_gguf
def test_inspect_of_the_converted_file(converted, capsys):
    assert main(["inspect", str(converted[0].path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"q8_g32_fp16 +211 tensors", out) and re.search(r"fp32 +61 tensors", out)


def test_unpermute_inverts_llama_cpp_permute():
    heads, head_dim, cols = 3, 8, 5
    weight = np.arange(heads * head_dim * cols, dtype=np.float32).reshape(heads * head_dim, cols)
    permuted = (
        weight.reshape(heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(weight.shape)
    )  # LlamaModel.permute
    assert not np.array_equal(permuted, weight)
    assert np.array_equal(unpermute_rows(permuted, heads), weight)


def test_unsupported_architecture_is_named(tmp_path):
    src = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(src), "qwen3")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ArtifactError, match='unsupported GGUF architecture "qwen3"') as caught:
        convert_gguf(src, tmp_path / "out.ninfer")
    assert str(caught.value).startswith(str(src)) and not (tmp_path / "out.ninfer").exists()
