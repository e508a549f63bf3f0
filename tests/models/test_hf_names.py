"""HF config / name mapping and the shared rotary helper."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.models.gated_attention import PartialRope
from ninfer_engine.artifact.hf_names import logical_params_from_hf, text_config_from_hf
from tests.models.qwen35_tiny import hf_config, hf_model
from tests.tolerance import TRANSCENDENTAL, bound

pytest.importorskip("transformers.models.qwen3_5_moe")


def test_config_normalisation_per_family():
    dense = text_config_from_hf(hf_config("qwen3_5"))
    assert dense["architectures"] == ["Qwen3_5ForCausalLM"]
    assert dense["tie_word_embeddings"] and dense["intermediate_size"] == 96
    assert dense["rope_parameters"] == {
        "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]
    }
    assert dense["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    moe = text_config_from_hf(hf_config("qwen3_5_moe"))
    assert moe["model_type"] == "qwen3_5_moe_text" and moe["norm_topk_prob"]
    assert "intermediate_size" not in moe and "mlp_only_layers" not in moe
    nxt = text_config_from_hf(hf_config("qwen3_next"))
    assert nxt["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert "mrope_section" not in nxt["rope_parameters"]
    assert text_config_from_hf(hf_config("qwen3_next_mixed"))["mlp_only_layers"] == [1]


def test_qwen3_next_sparse_step_becomes_mlp_only_layers():
    cfg = hf_config("qwen3_next").to_dict()
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[3])
    assert text_config_from_hf(cfg)["mlp_only_layers"] == [0, 2, 3]


def test_pre_v5_checkpoint_config_dict():
    cfg = hf_config("qwen3_next").to_dict()
    del cfg["layer_types"], cfg["rope_parameters"]
    cfg.update(rope_theta=1e7, partial_rotary_factor=0.25, rope_scaling=None,
               full_attention_interval=2)
    out = text_config_from_hf(cfg)
    assert out["rope_parameters"] == {"rope_theta": 1e7, "partial_rotary_factor": 0.25}
    assert out["layer_types"] == ["linear_attention", "full_attention"] * 2


def test_multimodal_wrapper_and_prefixes_are_accepted():
    hf = hf_model("qwen3_5_moe")
    text = {k: v for k, v in hf.config.to_dict().items() if k != "model_type"}
    config = text_config_from_hf({"model_type": "qwen3_5_moe", "text_config": text})
    assert config == text_config_from_hf(hf.config)
    sd = {k.replace("model.", "model.language_model.", 1): t for k, t in hf.state_dict().items()}
    sd["model.visual.blocks.0.norm1.weight"] = torch.zeros(4)
    sd["mtp.fc.weight"] = torch.zeros(4, 4)
    mapped = logical_params_from_hf(sd, config)
    plain = logical_params_from_hf(hf.state_dict(), text_config_from_hf(hf.config))
    assert mapped.keys() == plain.keys()


def test_per_expert_checkpoint_tensors_equal_fused():
    hf = hf_model("qwen3_next")
    config = text_config_from_hf(hf.config)
    fused = hf.state_dict()
    split, width = {}, config["moe_intermediate_size"]
    for name, t in fused.items():
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                split[f"{base}{e}.gate_proj.weight"] = t[e, :width]
                split[f"{base}{e}.up_proj.weight"] = t[e, width:]
        elif name.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                split[f"{name[: -len('down_proj')]}{e}.down_proj.weight"] = t[e]
        else:
            split[name] = t
    a, b = logical_params_from_hf(fused, config), logical_params_from_hf(split, config)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_unexpected_tensor_is_refused():
    hf = hf_model("qwen3_5")
    sd = dict(hf.state_dict(), **{"model.layers.0.mystery.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="mystery"):
        logical_params_from_hf(sd, text_config_from_hf(hf.config))


def test_interleaved_mrope_matches_hf_rotary():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    cfg = hf_config("qwen3_5")
    cfg.head_dim = 48  # rd = 12: six frequencies, so every axis owns some
    cfg.rope_parameters = dict(cfg.rope_parameters, mrope_section=[2, 2, 2])
    positions = torch.randint(0, 500, (3, 1, 9), generator=torch.Generator().manual_seed(0))
    ref_cos, ref_sin = Qwen3_5TextRotaryEmbedding(cfg)(torch.zeros(1), positions)
    rope = PartialRope(48, text_config_from_hf(cfg)["rope_parameters"])
    cos, sin = rope.cos_sin(positions[:, 0], torch.float32)
    # fp32 both sides: the frequencies (a power and a division) and the angle pos · f (a
    # product) carry relative error into an angle of up to max(pos) radians, an absolute error
    # cos / sin pass on; then cos / sin themselves
    atol = (bound(torch.float32, TRANSCENDENTAL + 2) * positions.max().item()
            + bound(torch.float32, TRANSCENDENTAL))
    torch.testing.assert_close(cos, ref_cos[0], rtol=0, atol=atol)
    torch.testing.assert_close(sin, ref_sin[0], rtol=0, atol=atol)


def test_multimodal_tie_flag_follows_the_outer_config():
    text = {k: v for k, v in hf_config("qwen3_5").to_dict().items() if k != "model_type"}
    for outer, inner, tied in ((False, True, False), (True, False, True), (None, True, True)):
        wrapper = {"model_type": "qwen3_5", "text_config": {**text, "tie_word_embeddings": inner}}
        if outer is not None:
            wrapper["tie_word_embeddings"] = outer
        assert text_config_from_hf(wrapper)["tie_word_embeddings"] is tied
