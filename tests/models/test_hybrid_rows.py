"""`Qwen35Model.forward_rows`: the rows of one step (a decode token, a prompt's next chunk, a
fresh prompt) in one forward give each row's logits and state as if it ran alone."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.tolerance import TRANSCENDENTAL, bound, gated_delta_depth

from .qwen35_tiny import hf_model, ours

pytest.importorskip("transformers.models.qwen3_5_moe")

# tokens already in each row's state, and the tokens the step adds to it
PAST, NEW = (20, 70, 0), (1, 33, 9)


def _depth(config: dict, tokens: int) -> float:
    """Reductions along one token's chain: per layer the two norms, the input projection, the
    mixer's core (the chunked gated delta rule over up to `tokens` steps with no decay, or
    attention's scores and weighted sum over `tokens` keys), its output projection and the
    MLP/MoE's two projections; then the final norm and the head."""
    h, layers = config["hidden_size"], config["layer_types"]
    mlp = max(config.get("intermediate_size", 0), config.get("moe_intermediate_size", 0),
              config.get("shared_expert_intermediate_size", 0))
    gdn = gated_delta_depth(torch.zeros(tokens, 1), config["linear_key_head_dim"], 64,
                            normalize=True)
    attention = config["head_dim"] + 2 * tokens + TRANSCENDENTAL
    per_layer = [4 * h + mlp + (gdn if kind == "linear_attention" else attention)
                 + config["num_attention_heads"] * config["head_dim"] for kind in layers]
    return sum(per_layer) + 2 * h


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@torch.inference_mode()
def test_the_rows_of_one_forward_equal_each_row_run_alone(family):
    model = ours(hf_model(family))
    gen = torch.Generator().manual_seed(5)
    past = [torch.randint(0, 128, (n,), generator=gen) for n in PAST]
    new = [torch.randint(0, 128, (n,), generator=gen) for n in NEW]
    states = []
    for tokens in past:
        state = model.new_state()
        if len(tokens):
            model.forward(tokens, state)
        states.append(state)
    alone = copy.deepcopy(states)
    got = model.forward_rows(torch.cat(new), states, list(NEW))
    want = torch.cat([model.forward(t, s, last_only=True) for t, s in zip(new, alone)])
    assert got.shape == want.shape == (len(NEW), model.vocab_size)
    # two fp32 computations of each row: they differ only in how the matmuls group the rows
    limit = bound(torch.float32, _depth(model.config, max(map(sum, zip(PAST, NEW)))))
    assert (got - want).abs().max() <= limit * want.abs().max()
    for ours_state, ref_state in zip(states, alone):
        assert ours_state.seen == ref_state.seen
        for a, b in zip(ours_state.layers, ref_state.layers):
            for name in ("ssm", "conv", "k", "v"):
                if hasattr(b, name):
                    x, y = getattr(a, name), getattr(b, name)
                    assert x.shape == y.shape
                    assert (x - y).abs().max() <= limit * max(y.abs().max(), 1e-30)


@torch.inference_mode()
def test_sampled_picks_the_rows_whose_logits_come_back():
    model = ours(hf_model("qwen3_5"))
    tokens = torch.arange(1, 8)
    every = model.forward_rows(tokens, [model.new_state() for _ in range(3)], [2, 4, 1])
    picked = model.forward_rows(tokens, [model.new_state() for _ in range(3)], [2, 4, 1], [2, 0])
    # the same hidden rows; only the head's length-H products may group differently (BLAS
    # picks its kernel by the row count)
    limit = bound(torch.float32, model.config["hidden_size"]) * every.abs().max()
    assert (picked - every[[2, 0]]).abs().max() <= limit
    # a step whose only row is a prompt chunk that does not end the prompt samples nothing
    assert model.forward_rows(tokens, [model.new_state()], [7], []).shape == (0, model.vocab_size)
