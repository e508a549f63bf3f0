"""`MissCosts`: what a missed expert costs copied into a slot or computed on the CPU.

Measured once at startup on the model's own first expert (`measure`): the host → slot copy
rate (the page-locked store to the device slots: PCIe on a GPU, memcpy on the CPU reference),
and the CPU's SwiGLU time for one expert at several row counts (torch on the host cores,
whatever vector units it finds). A miss of `rows` rows is computed on the CPU when that,
plus moving its activations both ways, is faster than copying the expert (Fiddler's rule);
a copied expert may also hit later, which the rule ignores, so it leans to the CPU at batch 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..models.experts import ExpertStack

ROWS = (1, 2, 4, 8, 16, 64, 256)
COPY_EXPERTS = 4  # experts the copy rate is timed over


def row_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the rows a step hands the host's cores: bf16 on a GPU, fp32 on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True)
class MissCosts:
    copy_bytes_per_s: float
    cpu_seconds: tuple[tuple[int, float], ...]  # (rows, seconds of one expert's SwiGLU)

    def cpu_time(self, rows: int) -> float:
        """Seconds of one expert over `rows` rows: linear between the measured points."""
        points = self.cpu_seconds
        for (r0, t0), (r1, t1) in zip(points, points[1:]):
            if rows <= r1:
                return t0 + (t1 - t0) * (max(rows, r0) - r0) / (r1 - r0)
        r, t = points[-1]
        return t * rows / r

    def prefer_cpu(self, rows: int, expert_bytes: int, row_bytes: int) -> bool:
        moved = 2 * rows * row_bytes  # activations to the host and the result back
        return self.cpu_time(rows) + moved / self.copy_bytes_per_s < (
            expert_bytes / self.copy_bytes_per_s)


def best_seconds(fn, repeats: int = 3, sync=lambda: None) -> float:
    """The shortest of `repeats` timed calls of `fn` (`sync` before and after each: the
    device's queue drained), at least 1 ns."""
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return max(min(times), 1e-9)


def measure(host: tuple[ExpertStack, ExpertStack], slots: tuple[ExpertStack, ExpertStack],
            compute, repeats: int = 3) -> MissCosts:
    """Time copying host experts into slot 0 (one, then `COPY_EXPERTS` in a row, expert 0
    last: the rate is the slope, without a call's launch and sync) and `compute(x, 0)` (the
    CPU SwiGLU of expert 0) at each of `ROWS`; best of `repeats`."""
    device = slots[0].w.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def best(fn) -> float:
        return best_seconds(fn, repeats, sync)

    def copy(experts):
        for e in experts:
            for src, dst in zip(host, slots):
                dst.w[0].copy_(src.w[e], non_blocking=True)
                if src.scale is not None:
                    dst.scale[0].copy_(src.scale[e], non_blocking=True)

    nbytes = sum(s.expert_bytes for s in host)
    n = min(COPY_EXPERTS, host[0].w.shape[0])
    one, many = best(lambda: copy([0])), best(lambda: copy(range(n - 1, -1, -1)))
    # (one 3.2 MB expert timed alone on an H100: 81-86 µs, where the captured step reads a
    # miss in place in ~60: bench/results/h100-expert-offload-cpu-team.md)
    rate = (n - 1) * nbytes / (many - one) if n > 1 and many > one else n * nbytes / many
    hidden = host[1].w.shape[1]
    dtype = row_dtype(device)
    compute(torch.zeros(1, hidden, dtype=dtype), 0)  # warm: a first call also starts the team
    cpu = tuple((rows, best(lambda rows=rows: compute(torch.zeros(rows, hidden, dtype=dtype),
                                                      0))) for rows in ROWS)
    return MissCosts(rate, cpu)
