"""`ninfer convert hf` on tiny random HF checkpoints of every supported family.

Each checkpoint is written with `save_pretrained(safe_serialization=True)`; every binding of
the converted (fp32) artifact must equal the HF tensor after the documented transforms, and the
converted models must give HF's logits.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from ninfer_engine.artifact import open_artifact
from ninfer_engine.artifact.row_writer import StreamingWriter
from ninfer_engine.models import Segment, build_model
from ninfer_engine.artifact.hf_names import logical_params_from_hf, text_config_from_hf
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.cli.tools import main
from tests.engine.helpers import tiny_llama, tiny_qwen3
from tests.models.qwen35_tiny import hf_model, rel_err

QWEN = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
PROMPT = torch.tensor([3, 17, 99, 4, 64, 5, 120, 7, 31, 8])


def _hf(family: str):
    if family == "llama":
        return tiny_llama()
    if family == "qwen3":
        return tiny_qwen3()
    return hf_model(family)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (checkpoint dir, HF model); the MoE one is sharded (index + several files)."""
    out = {}
    for family in (*QWEN, "llama", "qwen3"):
        model = _hf(family)
        folder = tmp_path_factory.mktemp(family)
        shard = "40KB" if family == "qwen3_5_moe" else "1GB"
        model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
        assert (folder / "model.safetensors.index.json").exists() == (family == "qwen3_5_moe")
        out[family] = (folder, model)
    return out


def _convert(folder, out, *extra) -> int:
    return main(["convert", "hf", str(folder), "-o", str(out), *extra])


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory):
    """family -> converted fp32 artifact path."""
    folder = tmp_path_factory.mktemp("converted")
    paths = {}
    for family, (src, _) in checkpoints.items():
        paths[family] = folder / f"{family}.ninfer"
        assert _convert(src, paths[family], "--recipe", "fp32") == 0
    return paths


def _expected(family: str, model) -> dict[str, torch.Tensor]:
    """Logical name -> tensor: hf_names' transforms (Qwen), or the one-to-one §5 names."""
    state = model.state_dict()
    if family in QWEN:
        return logical_params_from_hf(state, text_config_from_hf(model.config))
    names = {"input_layernorm": "input_norm", "post_attention_layernorm": "post_attention_norm",
             "self_attn.q_proj": "attention/query", "self_attn.k_proj": "attention/key",
             "self_attn.v_proj": "attention/value", "self_attn.o_proj": "attention/output",
             "self_attn.q_norm": "attention/query_norm", "self_attn.k_norm": "attention/key_norm",
             "mlp.gate_proj": "mlp/gate", "mlp.up_proj": "mlp/up", "mlp.down_proj": "mlp/down"}
    out = {"text/token_embedding": state["model.embed_tokens.weight"],
           "text/final_norm": state["model.norm.weight"],
           "text/output_head": state.get("lm_head.weight", state["model.embed_tokens.weight"])}
    for key, t in state.items():
        if key.startswith("model.layers."):
            i, rest = key[len("model.layers."):].split(".", 1)
            out[f"text/layers/{i}/{names[rest.removesuffix('.weight')]}"] = t
    return out


@pytest.mark.parametrize("family", [*QWEN, "llama", "qwen3"])
def test_every_binding_equals_the_transformed_hf_tensor(family, checkpoints, converted):
    expected = _expected(family, checkpoints[family][1])
    with open_artifact(converted[family]) as artifact:
        assert set(artifact.bindings) == set(expected)
        for name, tensor in expected.items():
            got = artifact.parameter(name, tuple(tensor.shape))
            assert torch.equal(got, tensor.float()), name
        assert artifact.name == checkpoints[family][0].name
        meta = artifact.metadata["source"]
        assert meta["format"] == "hf-safetensors" and meta["recipe"] == "fp32"


@pytest.mark.parametrize("family", QWEN)
def test_converted_qwen_gives_hf_logits(family, checkpoints, converted):
    model = checkpoints[family][1]
    with open_artifact(converted[family]) as artifact:
        config = artifact.config()
        ours = Qwen35Model(config, lambda name, shape: artifact.parameter(name, shape))
    assert config == text_config_from_hf(model.config)
    with torch.no_grad():
        want = model(PROMPT[None]).logits[0]
    got = ours.forward(PROMPT, ours.new_state())
    assert rel_err(got, want) < 1e-4


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_converted_llama_family_gives_hf_logits(family, checkpoints, converted):
    model = checkpoints[family][1]
    with open_artifact(converted[family]) as artifact:
        config = artifact.config()
        ours = build_model(config, artifact)
    assert config["architectures"] == [type(model).__name__]
    cache = ours.new_cache()
    n = len(PROMPT)
    got = ours.forward(PROMPT, torch.arange(n), [Segment(cache, 0, n)], torch.tensor([n - 1]))
    with torch.no_grad():
        want = model(PROMPT[None]).logits[0, -1]
    assert rel_err(got[0], want) < 1e-4


def _mtp_tensors(h: int, q: int, kv: int, d: int, width: int) -> dict[str, torch.Tensor]:
    """A Qwen3.5-style `mtp.*` head (dense FFN) with random values."""
    gen = torch.Generator().manual_seed(5)
    shapes = {"fc.weight": (h, 2 * h), "pre_fc_norm_embedding.weight": (h,),
              "pre_fc_norm_hidden.weight": (h,), "norm.weight": (h,),
              "layers.0.input_layernorm.weight": (h,),
              "layers.0.post_attention_layernorm.weight": (h,),
              "layers.0.self_attn.q_proj.weight": (2 * q, h),
              "layers.0.self_attn.k_proj.weight": (kv, h),
              "layers.0.self_attn.v_proj.weight": (kv, h),
              "layers.0.self_attn.o_proj.weight": (h, q),
              "layers.0.self_attn.q_norm.weight": (d,), "layers.0.self_attn.k_norm.weight": (d,),
              "layers.0.mlp.gate_proj.weight": (width, h),
              "layers.0.mlp.up_proj.weight": (width, h),
              "layers.0.mlp.down_proj.weight": (h, width)}
    return {f"mtp.{k}": torch.randn(s, generator=gen) for k, s in shapes.items()}


def test_mtp_head_becomes_an_mtp_component(checkpoints, tmp_path):
    src, model = checkpoints["qwen3_5"]
    folder = tmp_path / "with-mtp"
    model.save_pretrained(folder, safe_serialization=True)
    mtp = _mtp_tensors(64, 4 * 32, 2 * 32, 32, 96)
    save_file(mtp, folder / "mtp.safetensors")
    assert _convert(folder, tmp_path / "m.ninfer", "--recipe", "fp32", "--name", "x") == 0
    with open_artifact(tmp_path / "m.ninfer") as artifact:
        assert artifact.components["mtp"]["config"] == {"architectures": ["Qwen3_5MTP"]}
        assert artifact.components["mtp"]["target"] == "text"
        assert artifact.name == "x"
        per_head = mtp["mtp.layers.0.self_attn.q_proj.weight"].reshape(4, 64, 64)
        checks = {"mtp/input_projection": mtp["mtp.fc.weight"],
                  "mtp/final_norm": mtp["mtp.norm.weight"],
                  "mtp/layers/0/attention/query": per_head[:, :32].reshape(128, 64),
                  "mtp/layers/0/attention/gate": per_head[:, 32:].reshape(128, 64),
                  "mtp/layers/0/mlp/down": mtp["mtp.layers.0.mlp.down_proj.weight"]}
        for name, want in checks.items():
            assert torch.equal(artifact.parameter(name, tuple(want.shape)), want), name
        # q_proj becomes query and gate: one binding more than checkpoint tensors
        assert sum(name.startswith("mtp/") for name in artifact.bindings) == len(mtp) + 1


def test_vision_tower_is_refused_unless_skipped(checkpoints, tmp_path, capsys):
    src, model = checkpoints["qwen3_5"]
    folder = tmp_path / "with-vision"
    model.save_pretrained(folder, safe_serialization=True)
    save_file({"model.visual.patch_embed.proj.weight": torch.zeros(8, 4)},
              folder / "vision.safetensors")
    assert _convert(folder, tmp_path / "v.ninfer") == 1
    err = capsys.readouterr().err
    assert "vision tower" in err and "--skip-vision" in err
    assert not (tmp_path / "v.ninfer").exists()
    assert _convert(folder, tmp_path / "v.ninfer", "--skip-vision") == 0


def test_resources_are_copied_and_template_extracted(checkpoints, tmp_path):
    src, model = checkpoints["llama"]
    folder = tmp_path / "with-tokenizer"
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 1 }}"}))
    assert _convert(folder, tmp_path / "r.ninfer") == 0
    with open_artifact(tmp_path / "r.ninfer") as artifact:
        assert artifact.resource("tokenizer.json") == b'{"version": "1.0"}'
        assert artifact.resource("chat_template.jinja") == b"{{ 1 }}"
        assert artifact.has_resource("generation_config.json")


RECIPE_FORMATS = {
    ("qwen3_5", "bf16"): {"bf16", "fp32"},
    ("qwen3_5", "fp8-row"): {"fp8_e4m3fn_row_bf16", "bf16", "fp32"},
    ("qwen3_5", "nvfp4"): {"nvfp4", "bf16", "fp32"},
    ("qwen3_5", "q8"): {"q8_g32_fp16", "bf16", "fp32"},
    ("qwen3_5", "qwen3_6_27b"): {"q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "bf16", "fp32"},
    ("qwen3_5_moe", "qwen3_6_35b_a3b"): {"q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16",
                                         "q8_g32_fp16", "bf16", "fp32"},
    ("qwen3_next", "nvfp4"): {"nvfp4", "bf16", "fp32"},
    ("qwen3", "q8"): {"q8_g32_fp16", "fp32"},
}


@pytest.mark.parametrize("family,recipe", sorted(RECIPE_FORMATS))
def test_recipe_formats_appear_in_inspect(family, recipe, checkpoints, tmp_path, capsys):
    src, model = checkpoints[family]
    out = tmp_path / "r.ninfer"
    assert _convert(src, out, "--recipe", recipe) == 0
    capsys.readouterr()
    assert main(["inspect", "--json", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["objects"]["formats"]) == RECIPE_FORMATS[family, recipe]
    expected = _expected(family, model)
    with open_artifact(out) as artifact:
        for name, tensor in expected.items():
            got = artifact.parameter(name, tuple(tensor.shape))
            assert rel_err(got, tensor.float()) < 0.2, name  # 4-bit grouped codes at worst


def test_unknown_recipe_is_one_line(checkpoints, tmp_path, capsys):
    assert _convert(checkpoints["llama"][0], tmp_path / "x.ninfer", "--recipe", "q3") == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and 'unknown recipe "q3"' in err[0]


@pytest.mark.parametrize("fmt", ["bf16", "fp32", "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16",
                                 "q8_g32_fp16", "fp8_e4m3fn_row_bf16", "nvfp4"])
def test_tensor_streamed_in_row_blocks_equals_the_whole_tensor(fmt, tmp_path):
    shape = (256, 128) if fmt == "nvfp4" else (300, 200)
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    path = tmp_path / "rows.ninfer"
    with StreamingWriter(path, components={"text": {"config": {}}}) as writer:
        writer.add_tensor("whole", tensor, fmt)
        writer.add_rows("rows", shape, fmt, iter(tensor.split(64)))
        writer.add_rows("norm", (100,), "fp32", [tensor[0, :100]])
    with open_artifact(path) as artifact:
        whole, rows = (artifact.objects[artifact.bindings[n][0].object] for n in ("whole", "rows"))
        assert (rows.bytes, rows.format) == (whole.bytes, whole.format)
        assert torch.equal(artifact.parameter("rows", shape), artifact.parameter("whole", shape))
        assert torch.equal(artifact.parameter("norm", (100,)), tensor[0, :100])


def test_missing_checkpoint_and_unknown_family_are_one_line(tmp_path, capsys):
    assert _convert(tmp_path / "absent", tmp_path / "x.ninfer") == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"ninfer: error: {tmp_path / 'absent'}: no config.json "
                   "(not a Hugging Face checkpoint folder)"]
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text('{"model_type": "gpt2"}')
    assert _convert(tmp_path / "gpt", tmp_path / "x.ninfer") == 1
    assert "no *.safetensors files" in capsys.readouterr().err
    save_file({"wte.weight": torch.zeros(2, 2)}, tmp_path / "gpt" / "model.safetensors")
    assert _convert(tmp_path / "gpt", tmp_path / "x.ninfer") == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and 'unsupported model_type "gpt2"' in err[0]
