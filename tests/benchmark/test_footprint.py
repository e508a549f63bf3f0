"""`ninfer bench`'s memory plan: planned bytes against what the served model holds, and the
refusal of a model that cannot fit (Flash-Next in bf16) before anything is drawn."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact.synth import synth_config
from ninfer_engine.benchmark import footprint as fp
from ninfer_engine.benchmark import run
from tests.benchmark.tiny import tiny_config, tiny_source

H200_FREE = int(141e9)


def test_flash_next_bf16_is_refused_with_the_alternatives():
    line = fp.refusal("flash-next", None, "bf16", "auto", H200_FREE)
    assert line is not None and "\n" not in line
    assert line.startswith("flash-next (48 layers) with --weights bf16 needs ~159 GB")
    assert "try --weights fp8-row (~80 GB) or --layers 39 or fewer" in line
    # the alternatives it names do fit
    assert fp.refusal("flash-next", None, "fp8-row", "auto", H200_FREE) is None
    assert fp.refusal("flash-next", 39, "bf16", "auto", H200_FREE) is None
    assert fp.refusal("flash-next", 40, "bf16", "auto", H200_FREE) is not None


def test_the_other_bench_archs_fit_one_h200():
    for arch in ("27b", "35b-a3b"):
        assert fp.refusal(arch, None, "bf16", "auto", H200_FREE) is None
    # Q4/Q5 experts under auto: bf16 when it fits (35B-A3B), fp8 groups when not (Flash-Next)
    per = fp.layer_bytes(synth_config("35b-a3b"), "qwen3_6_35b_a3b", "auto")
    assert fp.planned_bytes(per, 40, H200_FREE) == sum(per["fits"])
    per = fp.layer_bytes(synth_config("flash-next"), "qwen3_6_35b_a3b", "auto")
    assert fp.planned_bytes(per, 48, H200_FREE) == sum(per["tight"]) < 90e9


@pytest.mark.parametrize("recipe,mode", [("fp8-row", "auto"), ("qwen3_6_35b_a3b", "packed"),
                                         ("bf16", "auto")])
def test_planned_bytes_are_what_the_served_model_holds(recipe, mode):
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model

    config = tiny_config(True)
    config["moe_intermediate_size"] = 128  # whole Q4/Q5 groups: fp8-group experts
    model = Qwen35Model(config, FusedParams(config, run.packed_source(tiny_source(config),
                                                                      recipe, mode)))
    planned = fp.planned_bytes(fp.layer_bytes(config, recipe, mode), 2, H200_FREE)
    # the file formats' alignment padding is all that differs
    assert planned == pytest.approx(model.weight_bytes(), rel=0.01)


def test_cli_refuses_before_drawing(monkeypatch, capsys):
    from ninfer_engine.cli.tools import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (H200_FREE, int(150e9)))

    def never(*args, **kwargs):
        raise AssertionError("drew the model")

    monkeypatch.setattr(run, "run_decode_bench", never)
    assert main(["bench", "--arch", "flash-next", "--no-peer"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(
        "ninfer: error: flash-next (48 layers) with --weights bf16 needs ~159 GB")
    assert "--weights fp8-row" in err and "--layers 39 or fewer" in err
