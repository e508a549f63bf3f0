"""One OpenMP team per process on the CPU: build the engine's tensors on a thread that then ends.

libgomp gives every thread that starts a parallel region its own team of workers, and while
more OpenMP threads exist than CPUs a waiting worker spins only ~100 times before it sleeps
(the GOMP_SPINCOUNT throttle; setting GOMP_SPINCOUNT does not lift it). An engine that loads
on the caller's thread and steps on its own owns two teams (2 + 2 threads on a 2-core box), so
each of a CPU decode step's ~120 matmuls first waits for a worker's futex wake-up. Loading on
a short-lived thread, whose team goes away with it, leaves the step thread the only team:
default model decode in the engine +10-30 % with `--cpu-matmul bf16|int8` (alternating A/B
runs, 2-core AVX2 box; fp32, whose GEMVs are long and memory-bound, within the noise).
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def run_on_own_thread(fn: Callable[[], T], name: str = "ninfer-load") -> T:
    """`fn()` on a new thread that ends when it returns; its result, or its exception re-raised
    on the caller's thread."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the caller, who decides
            box["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
