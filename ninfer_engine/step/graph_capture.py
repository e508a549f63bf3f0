"""`record_graph`: a step captured into a CUDA graph, the one capture routine of the graphs
the engine replays (`decode_graphs.DecodeGraphs`' decode and prompt steps, `mtp_round`'s draft
rounds, `verify_chain`'s chained rounds).

The step runs once first on a side stream (its Triton kernels compile there, on the same
inputs), then is captured into a private memory pool in thread-local mode with the cyclic GC
off (the reasons are at the capture). The caller undoes what the warm-up changed (a
recurrent state it advanced, positions it moved) and replays the graph into its output.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import Callable, Iterator

import torch

log = logging.getLogger("ninfer.engine")


def record_graph(step: Callable[[], torch.Tensor],
                 pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`step` captured into the private memory `pool` on its loaded inputs, after one warm-up
    run on a side stream (compiles its kernels; the caller undoes what it changed); the graph
    and the output it replays into."""
    side = _warm_up_stream(torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the Triton kernels, same inputs
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread-local: another thread's CUDA call (a grammar mask's page-locked buffer, a VRAM
    # query) must not invalidate a capture that happens while requests run; no cyclic GC
    # inside it: a collected CUDAGraph (an earlier engine's) resets in this thread, which
    # invalidated captures in the H200 suite ("operation not permitted ... (function reset)")
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            out = step()
    finally:
        if collecting:
            gc.enable()
    return graph, out


@functools.cache
def _warm_up_stream(device: int) -> torch.cuda.Stream:
    """One side stream a device for every warm-up: the caching allocator keeps a freed block for
    the stream it was used on, so a fresh stream a capture kept each warm-up's intermediates
    reserved apart (the H100's 8-layer 35B-A3B `--spec mtp` server, 102 start-up graphs: 4,456
    MiB reserved with a stream a capture, 3,476 with one; the MTP rounds' 390 → 6)."""
    return torch.cuda.Stream(device)


@contextlib.contextmanager
def start_up_capture(what: str, device: torch.device) -> Iterator[None]:
    """Log what the start-up captures inside cost: seconds, and the device memory reserved
    for their graphs (each private pool holds its graphs' intermediates, outside the KV
    sizing's reserve)."""
    before, started = torch.cuda.memory_reserved(device), time.monotonic()
    yield
    log.info("start-up CUDA graphs captured (%s) in %.1f s: %.0f MiB reserved for them", what,
             time.monotonic() - started, (torch.cuda.memory_reserved(device) - before) / 2**20)
