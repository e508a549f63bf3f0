"""`HostPhases`: where an engine step's host time goes, phase by phase, without a profiler.

A verify step accepted on the host leaves the GPU idle from the read-back of its logits to the
next launch (`bench/results/h100-issue-bounds-after-fix.md`: 0.81 ms a step on the 35B-A3B
shape); cProfile slows the host it measures and a CUPTI trace slows every launch. This probe
times the engine's phases with `time.perf_counter` by wrapping them on one engine (instance
attributes shadowing its methods; the module-level `accept` of the postprocess while the probe
is on) and unwraps them on exit:

- `schedule`: the scheduler's `schedule` (admission, rows, chunks)
- `draft`: the drafts of the step's rows (`_draft`)
- `forward`: the runner's `forward` (the graphs: inputs loaded, the graph launched; uncaptured,
  the forward itself)
- `finish`: the postprocess (`_finish`), which holds `accept_rows` and, inside it, `read_back`
  (acceptance's argmax and its copy to the host: the wait for the GPU) and `keep` (the
  runner's rollback)
- `publish`: the stats snapshot (`_publish`); `flush`: the token events handed over

Times are inclusive (a phase counts what it calls) and summed over the calls inside the probe.
"""
from __future__ import annotations

import time
from collections import defaultdict

from ..step import postprocess

# (name, owner path on the engine, attribute): "" is the engine itself
PHASES = (("schedule", "scheduler", "schedule"), ("draft", "", "_draft"),
          ("forward", "runner", "forward"), ("finish", "", "_finish"),
          ("accept_rows", "", "_accept"), ("keep", "runner", "keep"),
          ("publish", "", "_publish"), ("flush", "_events", "flush"))


class HostPhases:
    """`with HostPhases(engine) as phases:` steps run inside are timed by phase (see the
    module docstring); `phases.report(steps)` gives the mean ms of each per step."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._wrapped: list[tuple[object, str]] = []

    def _timed(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed

    def __enter__(self) -> HostPhases:
        for name, path, attr in PHASES:
            owner = self.engine if not path else getattr(self.engine, path)
            setattr(owner, attr, self._timed(name, getattr(owner, attr)))
            self._wrapped.append((owner, attr))
        self._accept = postprocess.accept
        postprocess.accept = self._timed("read_back", self._accept)
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr in self._wrapped:
            delattr(owner, attr)  # the instance attribute goes; the method shows again
        self._wrapped.clear()
        postprocess.accept = self._accept

    def report(self, steps: int) -> str:
        """One line: each phase's mean ms a step over `steps` steps (with its call count where
        it is not one a step), in the order of `PHASES`, `read_back` after `accept_rows`."""
        order = [name for name, _, _ in PHASES]
        order.insert(order.index("accept_rows") + 1, "read_back")
        parts = []
        for name in order:
            if name in self.calls:
                calls = self.calls[name]
                note = "" if calls == steps else f" ({calls} calls)"
                parts.append(f"{name} {1e3 * self.seconds[name] / steps:.3f}{note}")
        return f"host phases, ms a step over {steps} steps: " + "; ".join(parts)
