"""Where a step's device waits on its host: a torch.profiler Chrome trace's device-idle time, by
the host's Python functions running meanwhile.

    python3 bench/trace_gaps.py TRACE.json[.gz] [--range "burst step "] [--top 40]

Why: the 8-layer 35B-A3B shape's 7,632-token prompt step keeps the H100 busy 21.2 ms of its
23.8-24.0 ms (`prompt_burst.py --profile`): ~2.6 ms of it the device waits for the host, and a
cProfile beside the profiler says what the host runs, not what the device waited for. Here, in
each step window (a `record_function` range whose name starts with `--range`, as
`prompt_burst.py`'s), the device is idle from the window's start to its first kernel, between
kernels, and from its last kernel to the window's end; each idle interval is charged to every
Python function (`--trace`'s `with_stack` frames) and op on the host thread that overlaps it,
by the overlap. A function's figure is inclusive (its callees' share counted in it), so the
list reads as a call tree: the innermost heavy frame is the place. The profiler slows the host
(every Python call is recorded), so the figures are inflated; read them as proportions.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def idle_intervals(window: tuple[float, float],
                   kernels: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of `window` (µs) no kernel covers."""
    start, end = window
    out, reach = [], start
    for a, b in _union([(max(a, start), min(b, end)) for a, b in kernels
                        if b > start and a < end]):
        if a > reach:
            out.append((reach, a))
        reach = max(reach, b)
    if end > reach:
        out.append((reach, end))
    return out


def _overlap(a: float, b: float, gaps: list[tuple[float, float]], starts: list[float]) -> float:
    """Total overlap of [a, b] with the sorted disjoint `gaps` (`starts` their starts)."""
    total, i = 0.0, max(bisect.bisect_right(starts, a) - 1, 0)
    while i < len(gaps) and gaps[i][0] < b:
        total += max(0.0, min(b, gaps[i][1]) - max(a, gaps[i][0]))
        i += 1
    return total


def analyse(events: list[dict], range_prefix: str = "burst step ") -> dict:
    """Per step window: its length, busy and idle µs, and the idle charged to each host
    function (name -> µs), over the windows' host thread."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    windows = sorted((e["ts"], e["ts"] + e["dur"], e["name"], e.get("tid")) for e in spans
                     if e.get("cat") == "user_annotation" and e["name"].startswith(range_prefix))
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e.get("cat") in DEVICE_CATS]
    host = [e for e in spans if e.get("cat") in HOST_CATS  # (the windows' own ranges apart)
            and not e["name"].startswith(range_prefix)]
    steps, charged = [], defaultdict(float)
    for start, end, name, tid in windows:
        gaps = idle_intervals((start, end), kernels)
        starts = [a for a, _ in gaps]
        idle = sum(b - a for a, b in gaps)
        mine: dict[str, float] = defaultdict(float)
        for e in host:
            if e.get("tid") == tid and e["ts"] < end and e["ts"] + e["dur"] > start:
                share = _overlap(e["ts"], e["ts"] + e["dur"], gaps, starts)
                if share > 0:
                    mine[e["name"]] += share
        for k, v in mine.items():
            charged[k] += v
        steps.append({"step": name, "window_us": end - start, "idle_us": idle,
                      "busy_us": end - start - idle, "lead_us": gaps[0][1] - start
                      if gaps and gaps[0][0] == start else 0.0,
                      "tail_us": end - gaps[-1][0] if gaps and gaps[-1][1] == end else 0.0,
                      "top": sorted(mine.items(), key=lambda kv: -kv[1])[:60]})
    return {"steps": steps, "total": sorted(charged.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--range", default="burst step ")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    result = analyse(load(args.trace), args.range)
    for s in result["steps"]:
        print(f"{s['step']}: window {s['window_us'] / 1e3:.3f} ms, device busy "
              f"{s['busy_us'] / 1e3:.3f}, idle {s['idle_us'] / 1e3:.3f} (lead "
              f"{s['lead_us'] / 1e3:.3f}, tail {s['tail_us'] / 1e3:.3f})")
        for name, us in s["top"][: args.top]:
            print(f"  {us / 1e3:8.3f} ms  {name[:110]}")


if __name__ == "__main__":
    main()
