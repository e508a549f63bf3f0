"""The miss cost model: CPU compute where its time (plus the activations' round trip) beats
copying the expert, by measured rates."""
from __future__ import annotations

import torch

from ninfer_engine.experts.cost_model import MissCosts, measure
from ninfer_engine.experts.placement import auto_budget
from ninfer_engine.models.experts import ExpertStack


def test_the_rule_compares_cpu_time_with_the_copy():
    # 1 GB/s copies; one expert on the CPU: 1 ms at 1 row, 2 ms at 4, 8 ms at 16
    costs = MissCosts(1e9, ((1, 1e-3), (4, 2e-3), (16, 8e-3)))
    assert costs.cpu_time(1) == 1e-3
    assert abs(costs.cpu_time(10) - 5e-3) <= 1e-18  # halfway from 4 to 16 rows (fp64 rounding)
    assert costs.cpu_time(32) == 16e-3  # past the last point: linear in rows
    expert = 3 * 2**20  # a 3 MiB expert copies in 3.1 ms
    assert costs.prefer_cpu(1, expert, 8192)
    assert not costs.prefer_cpu(16, expert, 8192)
    assert not costs.prefer_cpu(1, expert, 2**21)  # a huge activation row costs its transfer


def test_measure_times_the_copy_and_the_cpu_expert():
    host = (ExpertStack(torch.randn(2, 8, 16)), ExpertStack(torch.randn(2, 16, 4)))
    slots = (ExpertStack(torch.empty(1, 8, 16)), ExpertStack(torch.empty(1, 16, 4)))
    calls = []
    costs = measure(host, slots, lambda x, e: calls.append((tuple(x.shape), e)))
    assert costs.copy_bytes_per_s > 0 and all(t > 0 for _, t in costs.cpu_seconds)
    assert torch.equal(slots[0].w[0], host[0].w[0]) and torch.equal(slots[1].w[0], host[1].w[0])
    assert {shape for shape, _ in calls} == {(r, 16) for r, _ in costs.cpu_seconds}


def test_auto_budget_leaves_the_other_weights_kv_and_headroom():
    assert auto_budget(80 << 30, 10 << 30, 4 << 30, 1 << 30) == 65 << 30
    assert auto_budget(8 << 30, 10 << 30, 0, 0) == 0


def test_the_copy_rate_is_the_slope_without_a_calls_latency(monkeypatch):
    """One copy's time carries a launch and sync latency that a step's in-place reads do not
    pay: the rate comes from copies of 1 and of `COPY_EXPERTS` experts (timed here by a fake
    clock: 50 µs a call plus 10 µs an expert), so it is an expert's bytes per 10 µs; expert 0
    is the one left in the slot."""
    from ninfer_engine.experts import cost_model
    host = (ExpertStack(torch.randn(6, 8, 16)), ExpertStack(torch.randn(6, 16, 4)))
    slots = (ExpertStack(torch.empty(1, 8, 16)), ExpertStack(torch.empty(1, 16, 4)))
    times = iter([50e-6 + 10e-6, 50e-6 + cost_model.COPY_EXPERTS * 10e-6])

    def clocked(fn, repeats=3, sync=lambda: None):
        fn()  # the real copies
        return next(times, 1e-3)  # (then the CPU SwiGLU's timings)
    monkeypatch.setattr(cost_model, "best_seconds", clocked)
    costs = measure(host, slots, lambda x, e: None)
    per_10us = sum(s.expert_bytes for s in host) / 10e-6
    assert abs(costs.copy_bytes_per_s - per_10us) <= 1e-9 * per_10us
    assert torch.equal(slots[0].w[0], host[0].w[0]) and torch.equal(slots[1].w[0], host[1].w[0])
