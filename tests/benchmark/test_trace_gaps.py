"""bench/trace_gaps.py: a step's device-idle time charged to the host functions running then."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trace_gaps import analyse, idle_intervals  # noqa: E402


def _x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid, "pid": 1}


def test_idle_is_what_no_kernel_covers_inside_the_window():
    kernels = [(10, 30), (20, 40), (70, 90), (150, 160)]  # the first two overlap; last outside
    assert idle_intervals((0, 100), kernels) == [(0, 10), (40, 70), (90, 100)]
    assert idle_intervals((0, 100), []) == [(0, 100)]


def test_each_host_function_is_charged_its_overlap_with_the_device_s_idle_time():
    events = [
        _x("burst step 0", "user_annotation", 0, 100),
        _x("kernel a", "kernel", 10, 30, tid=7), _x("kernel b", "kernel", 70, 20, tid=7),
        _x("engine.py(1): step", "python_function", 0, 100),
        _x("runner.py(2): schedule", "python_function", 0, 12),  # idle 0..10: 10 µs
        _x("runner.py(3): inputs", "python_function", 35, 40),  # idle 40..70: 30 µs
        _x("other thread", "python_function", 0, 100, tid=2),  # not the window's thread
        {"ph": "i", "name": "marker", "ts": 50},  # not a span
    ]
    (step,) = analyse(events)["steps"]
    assert (step["window_us"], step["idle_us"], step["busy_us"]) == (100, 50, 50)
    assert (step["lead_us"], step["tail_us"]) == (10, 10)
    assert dict(step["top"]) == {"engine.py(1): step": 50, "runner.py(3): inputs": 30,
                                 "runner.py(2): schedule": 10}
