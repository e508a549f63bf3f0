"""`ninfer convert hf --dflash`: a z-lab DFlash checkpoint (their `DFlashDraftModel`, vendored in
tests/models/zlab_dflash.py, saved with `save_pretrained`) becomes the `dflash` component, and
our drafter over the converted file gives their forward's outputs; a drafter that does not fit
the target is refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

from ninfer_engine.artifact import open_artifact
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
