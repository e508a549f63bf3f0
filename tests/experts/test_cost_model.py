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
