"""Speculative verify rows on the hybrid reference forward: a row of the last sampled token and
k drafts gives the logits of k + 1 sequential decode steps, and `rollback` to any accepted
prefix leaves the state the sequential path has after it."""
from __future__ import annotations

import copy

import pytest
import torch

from ninfer_engine.models.gdn import GDNState
from tests.tolerance import bound

from .qwen35_tiny import hf_model, ours
from .test_hybrid_rows import _depth

pytest.importorskip("transformers.models.qwen3_5_moe")

PROMPT = 20


def _gdn(state):
    return [(layer.conv, layer.ssm) for layer in state.layers if isinstance(layer, GDNState)]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@pytest.mark.parametrize("k", [1, 2, 3])
@torch.inference_mode()
def test_a_verify_row_equals_sequential_decode_and_rolls_back_to_any_prefix(family, k):
    model = ours(hf_model(family))
    gen = torch.Generator().manual_seed(k)
    prompt = torch.randint(0, 128, (PROMPT,), generator=gen)
    row = torch.randint(0, 128, (k + 1,), generator=gen)  # last sampled token, then k drafts
    other = torch.randint(0, 128, (1,), generator=gen)  # a plain decode row beside it
    state, neighbour = model.new_state(), model.new_state()
    model.forward(prompt, state)
    model.forward(prompt[:7], neighbour)
    sequential, snapshots = copy.deepcopy(state), []
    want = []
    for token in row:
        want.append(model.forward(token[None], sequential, last_only=True))
        snapshots.append(copy.deepcopy(sequential))
    want = torch.cat(want)
    got = model.forward_rows(torch.cat([other, row]), [neighbour, state], [1, k + 1],
                             verify=frozenset({1}))
    assert got.shape == (1 + k + 1, model.vocab_size)  # the decode row's last, every verify one
    # two fp32 computations of the same tokens; only the projections group the rows otherwise
    limit = bound(torch.float32, _depth(model.config, PROMPT + k + 1))
    assert (got[1:] - want).abs().max() <= limit * want.abs().max()
    assert neighbour.seen == 8 and state.seen == PROMPT + k + 1
    for kept in range(1, k + 2):
        back = copy.deepcopy(state)
        model.rollback(back, kept)
        ref = snapshots[kept - 1]
        assert back.seen == ref.seen == PROMPT + kept
        for layer, ref_layer in zip(back.layers, ref.layers):
            if not isinstance(layer, GDNState):
                assert layer.length == ref_layer.length == PROMPT + kept
        for (conv, ssm), (ref_conv, ref_ssm) in zip(_gdn(back), _gdn(ref)):
            assert conv.shape == ref_conv.shape and ssm.shape == ref_ssm.shape
            assert (conv - ref_conv).abs().max() <= limit * ref_conv.abs().max()
            assert (ssm - ref_ssm).abs().max() <= limit * ref_ssm.abs().max()
        # decoding goes on from the rolled-back state as from the sequential one
        nxt = torch.tensor([5])
        after = model.forward(nxt, back, last_only=True)
        ref_after = model.forward(nxt, copy.deepcopy(ref), last_only=True)
        assert (after - ref_after).abs().max() <= limit * ref_after.abs().max()
