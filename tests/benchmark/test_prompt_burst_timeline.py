"""bench/prompt_burst.py's `gpu_timeline`: a step's kernels, their busy union and idle gaps."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from prompt_burst import STEP_RANGE, gpu_timeline  # noqa: E402

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def _event(name: str, start_us: float, end_us: float, device=CPU):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=end_us),
                           device_type=device)


def test_overlapping_kernels_count_once_and_the_gaps_between_them_are_idle():
    events = [_event(f"{STEP_RANGE}0", 0, 10_000),
              _event("a", 100, 2_000, CUDA), _event("b", 1_500, 3_000, CUDA),  # overlap
              _event("c", 5_000, 9_000, CUDA),  # after a 2 ms gap
              _event(f"{STEP_RANGE}0", 100, 9_000, CUDA),  # the range's own device row
              _event(f"{STEP_RANGE}1", 10_000, 12_000), _event("d", 10_500, 11_000, CUDA),
              _event(f"{STEP_RANGE}2", 12_000, 13_000)]  # no kernel: no row
    first, second = gpu_timeline(events)
    assert first == {"step": 0, "window_ms": 10.0, "kernels": 3, "busy_ms": 6.9,
                     "span_ms": 8.9, "idle_ms": 2.0, "lead_ms": 0.1}
    assert (second["step"], second["busy_ms"], second["idle_ms"]) == (1, 0.5, 0.0)
