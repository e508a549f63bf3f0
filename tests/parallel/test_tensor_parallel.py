"""Tensor parallelism over gloo: two rank processes give tp1's greedy tokens for the llama,
qwen3_5 and qwen3_5_moe families (routed experts split by id and by intermediate; prompt-lookup
verify rows rolled back on both ranks), and a fault
on rank 1 fails the engine on rank 0 (every stream ends with an in-band 503, FAILED)."""
from __future__ import annotations

import pytest

from ninfer_engine.engine import Engine

from .ranks import CASES, FAULT_CASE, artifact, config, drafted, generate, run_ranks


@pytest.fixture(scope="module")
def two_ranks():
    return run_ranks(world=2)


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=["-".join(map(str, c[:3])) for c in CASES])
def test_two_ranks_greedy_equals_tp1(two_ranks, case):
    family, experts, spec, n = CASES[case]
    assert len(two_ranks) > case, "the two ranks gave no result"
    got_family, got_experts, tokens, state, drafts = two_ranks[case]
    assert (got_family, got_experts, state) == (family, experts, "ready")
    engine = Engine(config(experts, spec), artifact(family))  # tp1, in this process
    engine.start()
    try:
        expected = generate(engine, n)
    finally:
        engine.stop()
    assert tokens == expected
    assert all(finish == "length" and len(t) == n for t, finish in tokens)
    if spec:  # verify rows ran (and were cut back) on both ranks
        assert drafts > 0 and drafted(engine) > 0


def test_fault_on_rank_1_fails_the_engine_within_seconds(two_ranks):
    assert len(two_ranks) == len(CASES) + 1, "the fault case gave no result"
    family, experts, streams, state, seconds, failed = two_ranks[-1]
    assert (family, experts) == FAULT_CASE[:2]
    assert state == "failed" and len(failed) == 1
    # both streams end in-band with the engine's 503 error, before their 12 tokens
    assert [code for _, code in streams] == ["service_unavailable"] * 2
    assert all(len(tokens) < 12 for tokens, _ in streams)
    # the fault is at rank 1's third step: a few steps, then the broken collective
    assert seconds < 5.0
