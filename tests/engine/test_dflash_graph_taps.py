"""`--spec dflash` on the graph path (`HybridStep` keeping `feature_taps`): a verify step (rows
with 2 and 0 drafts) and then a decode step hand the drafter the same positions as the eager
runner, and each tap layer's residual output (HF `hidden_states[l+1]`) within the step's bf16
bound (`test_hybrid_graphs._tols`: the chain to the logits, longer than to any tap layer).
Runs wherever the step's kernels run: on the CPU under the Triton interpreter, and on CUDA
(`NINFER_TEST_DEVICE=cuda`)."""
from __future__ import annotations

import torch

from .test_hybrid_graphs import _model, _rel, _tols
from .test_hybrid_verify import sink_sides


@torch.inference_mode()
def test_graph_step_hands_the_drafter_the_eager_forwards_tap_features(device):
    model = _model(False, device)
    model.feature_taps = (1, 0)  # concatenated in tap order, not layer order
    H = model.config["hidden_size"]
    _, tol, _ = _tols(model, 62 + 4)
    got, want = sink_sides(model)
    assert [(i, at, h.shape) for i, at, h in got] == [(i, at, h.shape) for i, at, h in want] == [
        (0, 7, (3, 2 * H)), (1, 62, (1, 2 * H)), (0, 9, (1, 2 * H)), (1, 63, (1, 2 * H))]
    for (_, _, a), (_, _, b) in zip(got, want):
        for t in range(2):  # each tap against its own scale
            assert _rel(a[:, t * H: (t + 1) * H], b[:, t * H: (t + 1) * H]) < tol
