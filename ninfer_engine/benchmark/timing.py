"""CUDA timing helpers: event-timed loops, CUDA-graph capture, and the device copy bandwidth."""

from __future__ import annotations

from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], n: int, warm_up: bool = True) -> float:
    """Mean milliseconds of `fn` over `n` calls by CUDA events, after one warm-up call unless
    the caller has warmed it up."""
    if warm_up:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def last_graph_ms(engine, n: int = 30) -> float:
    """Mean ms of the decode graph `engine`'s last step replayed, back to back: its step without
    the host's work (its inputs stay as the last step loaded them; the recurrent state moves
    on, which a benchmark of random weights does not mind); NaN before any replay."""
    graph = engine.runner.graphs.last_replayed()
    return float("nan") if graph is None else time_ms(graph.replay, n)


def graph_of(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`fn` captured in a CUDA graph, after two warm-up calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def copy_bandwidth_gbps() -> float:
    """Bytes read + written per second (GB/s) by a 2 GiB device-to-device bf16 copy."""
    gbps = _copy_gbps(1 << 30)
    torch.cuda.empty_cache()  # (the buffers went with `_copy_gbps`' frame)
    return gbps


def _copy_gbps(n: int) -> float:
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def matmul_tflops(n: int = 8192, reps: int = 20) -> float:
    """bf16 TFLOP/s of an `n × n × n` `torch.matmul` (cuBLAS), the compute roofline's rate."""
    ms = _matmul_ms(n, reps)
    torch.cuda.empty_cache()  # (the matrices went with `_matmul_ms`' frame)
    return 2 * n**3 / ms / 1e9


def _matmul_ms(n: int, reps: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    time_ms(lambda: torch.matmul(a, b, out=c), 3)  # cuBLAS heuristics and clocks settle
    return time_ms(lambda: torch.matmul(a, b, out=c), reps)
