"""The transformers peer is the same model: config mapping, random init, greedy cache loop."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact.hf_names import logical_params_from_hf, text_config_from_hf
from ninfer_engine.models.qwen3_5 import Qwen35Model, dict_params
from tests.benchmark.tiny import tiny_config
from tests.models.qwen35_tiny import hybrid_depth
from tests.tolerance import bound

pytest.importorskip("transformers.models.qwen3_5_moe")

from ninfer_engine.benchmark.peer import (hf_config, hf_decode, hf_prefill,  # noqa: E402
                                          random_hf_model)


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def pair(request):
    config = tiny_config(request.param)
    return config, random_hf_model(config, "cpu", torch.float32)


def test_hf_config_maps_back_to_ours(pair):
    config, _ = pair
    back = text_config_from_hf(hf_config(config))
    assert back.pop("rms_norm_eps") == pytest.approx(config["rms_norm_eps"])
    assert back == {k: v for k, v in config.items() if k != "rms_norm_eps"}


def test_random_hf_model_is_our_model(pair):
    """Its weights through hf_names give our reference model the same logits."""
    config, hf = pair
    tensors = logical_params_from_hf(hf.state_dict(), text_config_from_hf(hf.config))
    ours = Qwen35Model(config, dict_params(tensors))
    ids = torch.randint(0, config["vocab_size"], (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        got = ours.forward(ids, ours.new_state())
    # fp32 both sides: γ of the model's chain, relative to the largest |logit|
    tol = bound(torch.float32, hybrid_depth(config, len(ids)))
    assert ((got - ref).abs().max() / ref.abs().max()).item() < tol
    assert torch.isfinite(ref).all() and ref.std() > 0.1  # not a degenerate init


def test_greedy_cache_loop_matches_full_forwards(pair):
    config, hf = pair
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, config["vocab_size"], (1, 30), generator=gen)
    token, cache = hf_prefill(hf, ids)
    fed = hf_decode(hf, token, cache, 4)
    seq = ids
    with torch.no_grad():
        for i in range(4):
            seq = torch.cat([seq, hf(seq).logits[:, -1:].argmax(-1)], 1)
    assert fed.tolist() == seq[:, 30:].tolist()
