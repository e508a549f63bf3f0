"""`ninfer convert hf` on a tiny multimodal Qwen3.5 checkpoint: the vision tower becomes the
`vision` component (ninfer-format.md §3.1, §3.2) and the text part is converted as before.

The model is the model-math.md §7 tiny vision config on the tiny dense text model, seeded, with
every parameter (1-D ones included) randomised, saved with `save_pretrained`.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.artifact import open_artifact
from ninfer_engine.artifact.recipes import RECIPES
from ninfer_engine.artifact.hf_names import logical_params_from_hf, text_config_from_hf
from ninfer_engine.artifact.hf_vision_names import vision_config_from_hf
from ninfer_engine.cli.tools import main
from tests.models.qwen35_tiny import hf_config, rel_err

VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
              num_position_embeddings=16)
PREPROCESSORS = {"preprocessor_config.json": b'{"patch_size": 4}',
                 "video_preprocessor_config.json": b'{"patch_size": 4, "fps": 2}'}


def _model():
    from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    # tied on both levels, like Qwen3.5-0.8B (HF ties by the outer flag, §3.1 by either)
    config = Qwen3_5Config(text_config=hf_config("qwen3_5").to_dict(), vision_config=VISION,
                           image_token_id=120, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration._from_config(config, attn_implementation="eager",
                                                         dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=gen).log())
            elif p.dim() == 1:
                p.copy_(torch.empty(p.shape).uniform_(-0.5, 0.5, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(checkpoint dir with preprocessor configs, HF model)."""
    model = _model()
    folder = tmp_path_factory.mktemp("qwen3_5_vl")
    model.save_pretrained(folder, safe_serialization=True)
    for role, data in PREPROCESSORS.items():
        (folder / role).write_bytes(data)
    return folder, model


def _convert(folder, out, *extra) -> int:
    return main(["convert", "hf", str(folder), "-o", str(out), *extra])


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    """{"vision": fp32 artifact, "text": fp32 artifact converted with --skip-vision}."""
    folder = tmp_path_factory.mktemp("converted")
    paths = {"vision": folder / "vl.ninfer", "text": folder / "text.ninfer"}
    assert _convert(checkpoint[0], paths["vision"], "--recipe", "fp32") == 0
    assert _convert(checkpoint[0], paths["text"], "--recipe", "fp32", "--skip-vision") == 0
    return paths


def _expected_vision(model) -> dict[str, torch.Tensor]:
    """`vision/...` name -> HF tensor after the documented transform, written out here."""
    state = {k[len("model.visual."):]: t for k, t in model.state_dict().items()
             if k.startswith("model.visual.")}
    h = VISION["hidden_size"]
    out = {"vision/patch_embedding": state["patch_embed.proj.weight"].reshape(h, 3 * 2 * 4 * 4),
           "vision/patch_embedding_bias": state["patch_embed.proj.bias"],
           "vision/position_embedding": state["pos_embed.weight"]}
    out.update({"vision/merger/norm_weight": state["merger.norm.weight"],
                "vision/merger/norm_bias": state["merger.norm.bias"],
                "vision/merger/fc1": state["merger.linear_fc1.weight"],
                "vision/merger/fc1_bias": state["merger.linear_fc1.bias"],
                "vision/merger/fc2": state["merger.linear_fc2.weight"],
                "vision/merger/fc2_bias": state["merger.linear_fc2.bias"]})
    for b in range(VISION["depth"]):
        hf, ln = f"blocks.{b}.", f"vision/layers/{b}/"
        for suffix, tail in (("weight", ""), ("bias", "_bias")):
            qkv = state[f"{hf}attn.qkv.{suffix}"]
            for i, role in enumerate(("query", "key", "value")):
                out[f"{ln}attention/{role}{tail}"] = qkv[i * h:(i + 1) * h]
            out[f"{ln}attention/output{tail}"] = state[f"{hf}attn.proj.{suffix}"]
            out[f"{ln}mlp/fc1{tail}"] = state[f"{hf}mlp.linear_fc1.{suffix}"]
            out[f"{ln}mlp/fc2{tail}"] = state[f"{hf}mlp.linear_fc2.{suffix}"]
            for n in (1, 2):
                out[f"{ln}norm{n}_{suffix}"] = state[f"{hf}norm{n}.{suffix}"]
    return out


def _bindings(artifact, prefix: str) -> set[str]:
    return {name for name in artifact.bindings if name.startswith(prefix)}


def test_vision_component_config_and_resources(converted):
    with open_artifact(converted["vision"]) as artifact:
        vision = artifact.components["vision"]
        assert vision["config"] == {"model_type": "qwen3_5_vision", **VISION}
        assert vision["target"] == "text"
        assert sorted(vision["resources"]) == sorted(PREPROCESSORS)
        for role, data in PREPROCESSORS.items():
            assert artifact.resource(role, "vision") == data
            assert not artifact.has_resource(role)  # not a text resource


def test_every_vision_binding_equals_the_transformed_hf_tensor(checkpoint, converted):
    expected = _expected_vision(checkpoint[1])
    with open_artifact(converted["vision"]) as artifact:
        assert _bindings(artifact, "vision/") == set(expected)
        for name, tensor in expected.items():
            got = artifact.parameter(name, tuple(tensor.shape))
            assert torch.equal(got, tensor), name


def test_vision_transforms_compute_what_hf_computes(checkpoint, converted):
    """The flattened patch kernel is HF's Conv3d on cut patches; q/k/v are HF's qkv split."""
    visual, shapes = checkpoint[1].model.visual, _expected_vision(checkpoint[1])
    x = torch.randn(6, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(1))
    tokens = torch.randn(6, VISION["hidden_size"], generator=torch.Generator().manual_seed(2))
    with open_artifact(converted["vision"]) as artifact:
        def p(name):
            return artifact.parameter(name, tuple(shapes[name].shape))

        with torch.no_grad():
            want = visual.patch_embed(x)
            qkv = visual.blocks[1].attn.qkv(tokens).reshape(6, 3, VISION["num_heads"], -1)
        got = F.linear(x, p("vision/patch_embedding"), p("vision/patch_embedding_bias"))
        assert rel_err(got, want) < 1e-6
        for i, role in enumerate(("query", "key", "value")):
            ours = F.linear(tokens, p(f"vision/layers/1/attention/{role}"),
                            p(f"vision/layers/1/attention/{role}_bias"))
            assert rel_err(ours.reshape(6, VISION["num_heads"], -1), qkv[:, i]) < 1e-6, role


def test_text_bindings_equal_the_text_only_conversion(checkpoint, converted):
    model = checkpoint[1]
    expected = logical_params_from_hf(model.state_dict(), text_config_from_hf(model.config))
    with open_artifact(converted["vision"]) as both, open_artifact(converted["text"]) as text:
        assert set(text.bindings) == set(expected)
        assert set(both.bindings) - _bindings(both, "vision/") == set(expected)
        assert both.config() == text.config() == text_config_from_hf(model.config)
        assert "vision" not in text.components
        assert not any(text.has_resource(role, "vision") for role in PREPROCESSORS)
        for name, tensor in expected.items():
            got = both.parameter(name, tuple(tensor.shape))
            assert torch.equal(got, tensor), name
            assert torch.equal(got, text.parameter(name, tuple(tensor.shape))), name


def test_inspect_lists_the_vision_component(converted, capsys):
    assert main(["inspect", "--json", str(converted["vision"])]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["components"]["vision"] == {
        "config": {"model_type": "qwen3_5_vision", **VISION},
        "resources": sorted(PREPROCESSORS), "target": "text",
    }
    # per block: q/k/v/output (+ bias), fc1/fc2 (+ bias), 2 norms × 2; plus 3 + 6 globals
    assert info["bindings"]["by_component"]["vision"] == VISION["depth"] * 16 + 9
    assert main(["inspect", str(converted["vision"])]) == 0
    assert "component vision -> text:  (qwen3_5_vision)" in capsys.readouterr().out


_OFFICIAL = {"q4_g64_fp16": ("attention/query", "attention/key", "attention/value", "mlp/fc1"),
             "q5_g64_fp16": ("attention/output", "mlp/fc2", "position_embedding"),
             "q6_g64_fp16": ("patch_embedding",), "q8_g32_fp16": ("merger/fc1", "merger/fc2")}


def _official_format(name: str, shape: tuple[int, ...]) -> str:
    """§4.3's vision rule for the grouped-int recipes, 1-D tensors fp32 as in every recipe."""
    if len(shape) == 1:
        return "fp32"
    return next(fmt for fmt, ends in _OFFICIAL.items() if name.endswith(ends))


def _generic_format(recipe: str, shape: tuple[int, ...]) -> str:
    """A vision matrix under the generic recipes: a projection like the text ones."""
    if recipe == "nvfp4":
        return "nvfp4" if shape[0] % 128 == 0 and shape[1] % 64 == 0 else "bf16"
    return {"bf16": "bf16", "fp8-row": "fp8_e4m3fn_row_bf16", "q8": "q8_g32_fp16"}[recipe]


def _format(artifact, name: str) -> str:
    return artifact.objects[artifact.bindings[name][0].object].format


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_writes_the_vision_tower(recipe, checkpoint, tmp_path):
    out = tmp_path / "r.ninfer"
    assert _convert(checkpoint[0], out, "--recipe", recipe) == 0
    expected = _expected_vision(checkpoint[1])
    with open_artifact(out) as artifact:
        assert _bindings(artifact, "vision/") == set(expected)
        for name, tensor in expected.items():
            fmt = _format(artifact, name)
            if recipe.startswith("qwen3_"):
                assert fmt == _official_format(name, tuple(tensor.shape)), name
            elif name == "vision/position_embedding":  # a table, stored like the embedding
                assert fmt == _format(artifact, "text/token_embedding")
            elif tensor.dim() == 1 or recipe == "fp32":
                assert fmt == "fp32", name
            else:
                assert fmt == _generic_format(recipe, tuple(tensor.shape)), name
            got = artifact.parameter(name, tuple(tensor.shape))
            assert rel_err(got, tensor) < 0.2, name  # 4-bit grouped codes at worst


def test_moe_vision_config_names_its_family():
    from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig

    config = Qwen3_5MoeConfig(text_config=hf_config("qwen3_5_moe").to_dict(),
                              vision_config=VISION, image_token_id=120)
    assert vision_config_from_hf(config) == {"model_type": "qwen3_5_moe_vision", **VISION}


def test_vision_width_must_match_the_text_width(checkpoint, tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    for item in checkpoint[0].iterdir():
        (folder / item.name).symlink_to(item)
    config = json.loads((checkpoint[0] / "config.json").read_text())
    config["vision_config"]["out_hidden_size"] = 48
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps(config))
    assert _convert(folder, tmp_path / "x.ninfer") == 1
    assert "out_hidden_size 48 differs from the text hidden_size 64" in capsys.readouterr().err
    assert _convert(folder, tmp_path / "x.ninfer", "--skip-vision") == 0
