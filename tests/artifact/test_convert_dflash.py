"""`ninfer convert hf --dflash`: a z-lab DFlash checkpoint (their `DFlashDraftModel`, vendored in
tests/models/zlab_dflash.py, saved with `save_pretrained`) becomes the `dflash` component, and
our drafter over the converted file gives their forward's outputs; a drafter that does not fit
the target is refused in one line; a DFlash2 checkpoint (random tensors under its published
names) becomes the `dflash2` component, every tensor under its logical name."""
from __future__ import annotations

import json

import pytest
import torch

from ninfer_engine.artifact import dflash_names, open_artifact
from ninfer_engine.cli.tools import main
from ninfer_engine.models.dflash import DFlashContext, load_dflash
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.models.qwen35_tiny import hf_model, rel_err
from tests.tolerance import bound

TAPS = [0, 2]


def _zlab(taps=TAPS, window=64):
    """Their drafter at a tiny shape: 2 layers (sliding, full), width 64 as the target's."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Config

    from tests.models.zlab_dflash import DFlashDraftModel

    config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, intermediate_size=96, num_hidden_layers=2,
                         rms_norm_eps=1e-6, rope_theta=1e7, vocab_size=128,
                         layer_types=["sliding_attention", "full_attention"],
                         sliding_window=window, use_sliding_window=True,
                         attn_implementation="eager")
    config.architectures = ["DFlashDraftModel"]
    config.dflash_config = {"target_layer_ids": taps, "mask_token_id": 127}
    config.block_size, config.num_target_layers = 16, 4
    torch.manual_seed(4)
    model = DFlashDraftModel(config).float().eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # plain norms: near 1
                p.copy_(1 + torch.empty(p.shape).uniform_(-0.3, 0.3, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(artifact path, their drafter, the HF target)."""
    folder = tmp_path_factory.mktemp("dflash")
    target, drafter = hf_model("qwen3_5"), _zlab()
    target.save_pretrained(folder / "target", safe_serialization=True)
    drafter.save_pretrained(folder / "drafter", safe_serialization=True)
    out = folder / "m.ninfer"
    assert main(["convert", "hf", str(folder / "target"), "--dflash", str(folder / "drafter"),
                 "-o", str(out), "--recipe", "fp32"]) == 0
    return out, drafter, target


def test_the_converted_drafter_gives_zlab_forward_outputs(converted):
    path, theirs, _ = converted
    with open_artifact(path) as artifact:
        component = artifact.components["dflash"]
        assert component["target"] == "text"
        assert component["config"]["dflash_config"] == {"target_layer_ids": TAPS,
                                                        "mask_token_id": 127}
        assert component["config"]["rope_parameters"] == {"rope_theta": 1e7}
        assert component["config"]["layer_types"] == ["sliding_attention", "full_attention"]
        model = Qwen35Model(artifact.config(), lambda n, s: artifact.parameter(n, s))
        ours = load_dflash(artifact, model, model.device, torch.float32)
    L, k = 19, 7  # inside the window: their eager attention does not apply it
    features = torch.randn(L, 2 * 64, generator=torch.Generator().manual_seed(6))
    ctx = DFlashContext(ours, 0)
    ours.extend(ctx, features)
    got = ours.propose([33], [ctx], [k])[0]
    noise = model.embed(torch.tensor([[33] + [127] * k]))
    with torch.no_grad():
        want = theirs(position_ids=torch.arange(L + 1 + k)[None], noise_embedding=noise,
                      target_hidden=features[None], use_cache=False, is_causal=False)[0, 1:]
    # two fp32 computations of one chain, each within the drafter's depth (test_dflash._depth)
    from tests.models.test_dflash import _depth
    limit = bound(torch.float32, _depth(component["config"], 2, L + k + 1))
    assert rel_err(got, want) <= limit, (rel_err(got, want), limit)


def test_a_drafter_that_does_not_fit_the_target_is_refused_in_one_line(tmp_path, capsys):
    target, drafter = hf_model("qwen3_5"), _zlab(taps=[0, 5])
    target.save_pretrained(tmp_path / "target", safe_serialization=True)
    drafter.save_pretrained(tmp_path / "drafter", safe_serialization=True)
    capsys.readouterr()  # (save_pretrained's progress bars)
    code = main(["convert", "hf", str(tmp_path / "target"), "--dflash",
                 str(tmp_path / "drafter"), "-o", str(tmp_path / "m.ninfer")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "\n" not in err, err
    assert "the DFlash checkpoint taps layers [0, 5], beyond 0..2 of the target's 4 layers" in err
    config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]


def _dflash2_checkpoint(folder, vocab: int) -> dict:
    """A DFlash2 checkpoint folder at a tiny shape (config.json and one safetensors file of
    random tensors under the published names, as vLLM's `qwen3_dflash2.py` loads them); its
    tensors by name."""
    from safetensors.torch import save_file

    h, heads, kv, d, ffn, taps, group, rank = 64, 4, 2, 16, 96, 2, 16, 8
    folder.mkdir()
    config = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": h,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
              "intermediate_size": ffn, "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
              "rope_theta": 1e7, "vocab_size": vocab, "sliding_window": 64,
              "layer_types": ["sliding_attention"] * 2, "block_size": 8,
              "num_target_layers": 4,
              "dflash_config": {"target_layer_ids": TAPS, "mask_token_id": 127,
                                "conv_kernel_size": taps, "conv_group_size": group,
                                "selector_rank": rank, "selector_top_k": 4}}
    (folder / "config.json").write_text(json.dumps(config))
    shapes = {"fc.weight": (h, len(TAPS) * h), "hidden_norm.weight": (h,), "norm.weight": (h,),
              "candidate_selector.hidden_projection.weight": (rank, h),
              "candidate_selector.predecessor_codebook": (vocab, rank),
              "candidate_selector.successor_codebook": (vocab, rank)}
    for i in range(2):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * d, h),
                       p + "self_attn.k_proj.weight": (kv * d, h),
                       p + "self_attn.v_proj.weight": (kv * d, h),
                       p + "self_attn.o_proj.weight": (h, heads * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h),
                       p + "mlp.down_proj.weight": (h, ffn)})
        for branch in ("attention_conv", "mlp_conv"):
            shapes.update({p + branch + ".base_kernel": (2, taps, h),
                           p + branch + ".kernel_projection.weight": (2 * taps * h // group, h)})
    gen = torch.Generator().manual_seed(8)
    tensors = {n: torch.randn(s, generator=gen) * 0.1 + (len(s) == 1) for n, s in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def test_a_dflash2_checkpoint_becomes_the_dflash2_component_tensor_for_tensor(tmp_path):
    target = hf_model("qwen3_5")
    target.save_pretrained(tmp_path / "target", safe_serialization=True)
    vocab = target.config.vocab_size
    theirs = _dflash2_checkpoint(tmp_path / "drafter", vocab)
    out = tmp_path / "m.ninfer"
    assert main(["convert", "hf", str(tmp_path / "target"), "--dflash", str(tmp_path / "drafter"),
                 "-o", str(out), "--recipe", "fp32"]) == 0
    with open_artifact(out) as artifact:
        assert "dflash" not in artifact.components
        config = artifact.components["dflash2"]["config"]
        assert config["architectures"] == ["DFlash2DraftModel"]
        assert config["dflash_config"]["selector_rank"] == 8
        stored = {n: artifact.parameter(n, s) for n, s in
                  dflash_names.parameter_shapes(config, vocab).items()}
        model = Qwen35Model(artifact.config(), lambda n, s: artifact.parameter(n, s))
        ours = load_dflash(artifact, model, model.device, torch.float32, backend="dflash2")
    assert len(stored) == len(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(stored[dflash_names.logical_name(name, "dflash2")], tensor), name
    ctx = DFlashContext(ours, 0)
    ours.extend(ctx, torch.randn(9, len(TAPS) * 64, generator=torch.Generator().manual_seed(9)))
    drafts, _ = ours.drafts(ours.propose([33], [ctx], [7]), [33], 127)
    assert len(drafts[0]) == 7 and all(0 <= t < 127 for t in drafts[0])
