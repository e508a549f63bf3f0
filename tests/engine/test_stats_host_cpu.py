"""The snapshot's CPU figures (issue 24: "CPU % and the engine process's RSS"): the process's CPU
use over the last refresh, in % of one core, is what its own CPU times say for that interval."""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import psutil

from ninfer_engine.config import EngineConfig
from ninfer_engine.step.stats_builder import StatsBuilder


def builder() -> StatsBuilder:
    model = SimpleNamespace(weight_bytes=lambda: 0, device="cpu", dtype=None, config=None)
    memory = SimpleNamespace(host_tier_bytes=lambda: (0, 0))
    return StatsBuilder("m", EngineConfig(artifact=Path("m.ninfer")), model, memory)


def cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def test_process_cpu_is_the_interval_cpu_time_over_wall_time():
    stats = builder()
    stats._memory(time.monotonic())  # the first refresh starts the interval
    began, cpu_began = time.monotonic(), cpu_seconds()
    while time.monotonic() - began < 1.2:  # busy: this process uses CPU
        sum(range(1000))
    expected = 100.0 * (cpu_seconds() - cpu_began) / (time.monotonic() - began)
    host, _ = stats._memory(time.monotonic())
    assert host.cpus == psutil.cpu_count()
    assert expected > 5.0  # the interval did use CPU (even on a loaded machine)
    assert abs(host.process_cpu - expected) < 0.25 * expected + 2.0, (host, expected)
    assert 0.0 < host.machine_cpu <= 100.0
    idle, _ = stats._memory(time.monotonic())  # within the refresh interval: the same reading
    assert idle is host
