"""The hybrid family's eager prompt step on CUDA queues its work without reading anything back
to the host: a sync in a layer serialises the host's launches of the next layers with the
GPU's work (the H200 served log showed ~30 ms for a prompt step of 120 tokens on 8 layers)."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.kv import LayerKv
from ninfer_engine.models import Segment
from ninfer_engine.models.attention import plan_segments

from .helpers import cuda_syncs
from .test_hybrid_graphs import _model, _storage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("moe", [False, True])
@torch.inference_mode()
def test_a_prompt_step_of_several_rows_never_waits_for_the_device(moe):
    model = _model(moe, torch.device("cuda"))
    gen = torch.Generator().manual_seed(3)
    lengths = (70, 45)

    def step():
        storage = _storage(model, "bf16")
        caches = [storage.new_cache() for _ in lengths]
        assert all(c.reserve(n) for c, n in zip(caches, lengths))
        plans = plan_segments([Segment(c, 0, n) for c, n in zip(caches, lengths)],
                              model.device)
        states = [model.bind_state([LayerKv(c, j, 0, plans)
                                    for j in range(len(model.attention_layers))],
                                   model.new_recurrent_state(), 0) for c in caches]
        ids = torch.randint(0, 512, (sum(lengths),), generator=gen).to(model.device)
        torch.cuda.synchronize()
        return lambda: model.forward_rows(ids, states, list(lengths))

    step()()  # compiles the kernels, sets up cuBLAS
    run = step()
    with cuda_syncs() as syncs:
        run()
    assert syncs == []
