from __future__ import annotations

import math

import torch

from ninfer_engine.step.sampling import Sampler, filter_logits
from ninfer_engine.step.sampling_penalties import apply_penalties
from ninfer_engine.types import SamplingParams


def _logits() -> torch.Tensor:
    # probabilities 0.4, 0.3, 0.2, 0.1 over tokens 3, 0, 2, 1
    return torch.tensor([0.3, 0.1, 0.2, 0.4]).log()


def _kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


def test_greedy_takes_argmax():
    s = Sampler(SamplingParams(temperature=0.0))
    assert [s.sample(_logits()) for _ in range(3)] == [3, 3, 3]


def test_top_k_mask():
    assert _kept(filter_logits(_logits(), top_k=2)) == {3, 0}
    assert _kept(filter_logits(_logits(), top_k=0)) == {0, 1, 2, 3}


def test_top_p_mask_keeps_smallest_nucleus():
    assert _kept(filter_logits(_logits(), top_p=0.5)) == {3, 0}
    assert _kept(filter_logits(_logits(), top_p=0.4)) == {3}
    assert _kept(filter_logits(_logits(), top_p=0.75)) == {3, 0, 2}
    assert _kept(filter_logits(_logits(), top_p=0.0)) == {3}  # the likeliest always stays


def test_min_p_mask_relative_to_top():
    # threshold 0.45·0.4 = 0.18 keeps 0.4, 0.3, 0.2
    assert _kept(filter_logits(_logits(), min_p=0.45)) == {3, 0, 2}
    assert _kept(filter_logits(_logits(), min_p=0.8)) == {3}


def test_filtered_values_unchanged():
    out = filter_logits(_logits(), top_k=3)
    assert torch.equal(out[[3, 0, 2]], _logits()[[3, 0, 2]])


def test_penalties():
    logits = torch.zeros(4)
    out = apply_penalties(logits, {1: 3, 2: 1}, presence=0.5, frequency=0.25)
    assert out.tolist() == [0.0, -1.25, -0.75, 0.0]
    assert logits.tolist() == [0.0] * 4


def test_frequency_penalty_changes_greedy_choice():
    s = Sampler(SamplingParams(temperature=0.0, frequency_penalty=1.0))
    logits = torch.tensor([0.0, 0.0, 0.0, 1.5])
    assert [s.sample(logits) for _ in range(3)] == [3, 3, 0]


def test_same_seed_same_tokens_and_different_seed_differs():
    logits = torch.zeros(1000)

    def run(seed: int) -> list[int]:
        s = Sampler(SamplingParams(temperature=1.0, seed=seed))
        return [s.sample(logits) for _ in range(20)]

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_sampling_follows_distribution():
    s = Sampler(SamplingParams(temperature=1.0, seed=0))
    draws = [s.sample(_logits()) for _ in range(4000)]
    share = draws.count(3) / len(draws)
    # a binomial share over 4000 draws: σ = √(0.4·0.6 / 4000) = 0.0077, so 0.03 is 3.9σ
    assert math.isclose(share, 0.4, abs_tol=0.03)


def test_temperature_sharpens():
    s = Sampler(SamplingParams(temperature=0.05, seed=1))
    assert all(s.sample(_logits()) == 3 for _ in range(50))
