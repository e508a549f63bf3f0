"""Our Qwen3.5-family model against HF transformers on tiny seeded fp32 models."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.models.qwen35_tiny import FAMILIES, hf_model, hybrid_depth, ours, rel_err
from tests.tolerance import TRANSCENDENTAL, bound

pytest.importorskip("transformers.models.qwen3_5_moe")


def _tol(model, context: int) -> float:
    """fp32 both sides (ours and HF's eager forward): γ of the model's chain over `context`
    tokens (`qwen35_tiny.hybrid_depth`), relative to the largest |logit| (`rel_err`)."""
    return bound(torch.float32, hybrid_depth(model.config, context))


def _prompt(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))


def _hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None]).logits[0]


def _ours_chunked(model, ids: torch.Tensor, chunks: list[int], state=None) -> torch.Tensor:
    state = model.new_state() if state is None else state
    outs, start, ids = [], 0, ids.to(model.device)
    for n in chunks:
        outs.append(model.forward(ids[start : start + n], state))
        start += n
    return torch.cat(outs)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, device):
    hf = hf_model(request.param)
    return hf, ours(hf, device)


@pytest.mark.parametrize("chunks", [[64, 64, 72], [50, 77, 73], [200]])
def test_chunked_prefill_matches_hf_full_forward(pair, chunks, record_property):
    hf, model = pair
    ids = _prompt(200, seed=1)
    ref = _hf_logits(hf, ids)
    with torch.no_grad():
        got = _ours_chunked(model, ids, chunks)
    err, last_err = rel_err(got, ref), rel_err(got[-1], ref[-1])
    record_property("max_rel_err_all_positions", err)
    tol = _tol(model, 200)
    assert last_err < tol and err < tol, (last_err, err)


def test_greedy_64_steps_match_hf(pair, record_property):
    hf, model = pair
    seq = _prompt(200, seed=2)
    state = model.new_state()
    with torch.no_grad():
        logits = _ours_chunked(model, seq, [64, 64, 72], state)[-1]
        worst, tol = 0.0, _tol(model, 264)
        for _ in range(64):
            ref = _hf_logits(hf, seq)[-1]
            worst = max(worst, rel_err(logits, ref))
            token = ref.argmax()
            top2 = ref.topk(2).values
            if top2[0] - top2[1] > 2 * tol * ref.abs().max():  # beyond what the two may differ by
                assert logits.argmax().item() == token.item()
            seq = torch.cat([seq, token[None]])
            logits = model.forward(token[None].to(model.device), state)[-1]
    record_property("max_rel_err_decode", worst)
    assert worst < tol
    assert len(set(seq[200:].tolist())) > 8  # a varied continuation, not one repeated token


def test_checkpoint_restore_continues_identically(pair):
    hf, model = pair
    prefix, cont_a, cont_b = _prompt(100, seed=3), _prompt(30, seed=4), _prompt(20, seed=5)
    with torch.no_grad():
        state = model.new_state()
        _ours_chunked(model, prefix, [64, 36], state)
        checkpoint = copy.deepcopy(state)
        first = _ours_chunked(model, cont_a, [17, 1, 12], state)
        # a different continuation from the same checkpoint, one decode token at a time
        state = copy.deepcopy(checkpoint)
        other = _ours_chunked(model, cont_b, [1] * 20, state)
        state = copy.deepcopy(checkpoint)
        again = _ours_chunked(model, cont_a, [17, 1, 12], state)
    assert torch.equal(first, again)
    ref = _hf_logits(hf, torch.cat([prefix, cont_b]))[100:]
    assert rel_err(other, ref) < _tol(model, 120)


def test_equal_mrope_axes_and_last_only_match_default(pair):
    _, model = pair
    ids = _prompt(70, seed=6).to(model.device)
    with torch.no_grad():
        default = model.forward(ids, model.new_state())
        axes = torch.arange(70, device=model.device).expand(3, -1)
        last = model.forward(ids, model.new_state(), positions=axes, last_only=True)
    # last_only changes only the final norm and the head's matmul (GEMV vs GEMM rounding)
    tol = bound(torch.float32, 2 * model.config["hidden_size"] + TRANSCENDENTAL)
    torch.testing.assert_close(last, default[-1:], rtol=tol, atol=tol * default.abs().max())
