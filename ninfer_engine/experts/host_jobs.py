"""`HostJobs`: the host's cores compute part of the captured decode step's missed experts.

An offloaded layer whose `InPlaceReads.mark_cpu` chose some experts maps each of them, while it
is not resident, to the tier's zero row: the device kernels read nothing for it from host
memory and add nothing. After the layer's routing kernel, `add` puts on a side stream, forked
from the step's stream and joined back before the layer's output is used:

    the rows, routed ids, weights and the layer's table row → page-locked staging (copies),
    a host function (`cpu_experts.c`'s `ninfer_cpu_moe_job`: every pair whose table entry is
    the zero row, in fp32 on the host's cores) → page-locked `out`,
    `out` → the device, added to the layer's fp32 sum on the step's stream.

All of it is stream work, so it is captured with the rest of the step into its CUDA graph (a
host function becomes a graph host node); the device kernels read the rest of the misses over
the bus meanwhile, so the two share a step's misses. The copies and the host function go
through the driver API (`cuMemcpyAsync`, `cuLaunchHostFunc`): torch's async copies to pinned
memory record allocator events, which a capture must not. On the CPU (the interpreter's tests)
the same pairs are found from the table and computed by `LayerTier.cpu_sum`, inline.

The staging buffers are shared by the layers (the side stream runs one layer's job after the
other) and sized for `rows` token rows; one job record a (layer, rows): a graph's host node
keeps its record's address.
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from ..kernels.cpu_experts import job_function, takes

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class MoeJob(ctypes.Structure):
    """`ninfer_moe_job` of cpu_experts.c, field for field."""
    _fields_ = [("x", _ptr), ("ids", _ptr), ("weights", _ptr), ("table", _ptr),
                *((name, _i64) for name in ("rows", "k", "H", "I", "E", "x_fp32", "cpu_row",
                                            "threads")),
                *((name, _ptr) for name in ("gu", "gu_scale", "down", "down_scale", "xf",
                                            "pair_rows", "pair_experts", "pair_weights", "act",
                                            "out")),
                ("pairs", _i64), ("calls", _i64), ("seconds", ctypes.c_double)]


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, _ptr]
    lib.cuLaunchHostFunc.argtypes = [_ptr, _ptr, _ptr]
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed: CUresult {result}")


def _copy(dst: torch.Tensor, src: torch.Tensor, stream: int) -> None:
    """`src` → `dst` (same bytes, either side device or page-locked host) on `stream`."""
    n = src.numel() * src.element_size()
    assert dst.numel() * dst.element_size() >= n and src.is_contiguous() and dst.is_contiguous()
    _check(_driver().cuMemcpyAsync(dst.data_ptr(), src.data_ptr(), n, stream), "cuMemcpyAsync")


def default_threads() -> int:
    """The job's OpenMP team: the cores this process may use, less two (the engine's own
    thread and the driver's)."""
    return max(1, len(os.sched_getaffinity(0)) - 2)


class HostJobs:
    """See the module docstring: `rows` token rows at most, `k` routed ids a row at most
    (the shared expert's column included), over the MoE layers of `layers` marked for CPU."""

    def __init__(self, layers: list[dict], rows: int, device, threads: int | None = None):
        tiers = [lay["tier"] for lay in layers
                 if getattr(getattr(lay.get("tier"), "in_place", None), "on_cpu", None)
                 is not None]
        self.device = torch.device(device)
        self.active = bool(tiers)
        if not tiers:
            return
        self.cuda = self.device.type == "cuda"
        assert not self.cuda or all(takes(t.host_gu, t.host_down) for t in tiers), \
            "host jobs on CUDA: fp8-row experts only (the compiled kernel's form)"
        t = tiers[0]
        H, I = t.host_down.w.shape[1:]
        k = max(lay["moe"].top_k + 1 for lay in layers if lay.get("tier") in tiers)
        self.threads = threads or default_threads()
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        pin = dict(pin_memory=self.cuda)
        self.x = torch.empty(rows * H * 4, dtype=torch.uint8, **pin)  # bf16 or fp32 rows
        self.ids = torch.empty(rows * k, dtype=torch.int64, **pin)
        self.weights = torch.empty(rows * k, dtype=torch.float32, **pin)
        self.table = torch.empty(t.experts + 1, dtype=torch.int64, **pin)
        self.out = torch.empty(rows, H, dtype=torch.float32, **pin)
        self.out_device = torch.empty(rows, H, dtype=torch.float32, device=self.device)
        self.scratch = dict(xf=torch.empty(rows, H), act=torch.empty(rows * k, I),
                            pair_rows=torch.empty(rows * k, dtype=torch.int64),
                            pair_experts=torch.empty(rows * k, dtype=torch.int64),
                            pair_weights=torch.empty(rows * k))
        self.jobs: dict[tuple[int, int], MoeJob] = {}

    def add(self, tier, y: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
            acc: torch.Tensor) -> None:
        """Add to `acc [rows, H]` (fp32) the pairs of routing `ids`/`weights` `[rows, k]` over
        rows `y [rows, H]` that `tier`'s table sends to its zero row (see the module
        docstring); nothing where `tier` has no CPU marks."""
        if not self.active or tier.in_place.on_cpu is None:
            return
        rows, k = weights.shape
        table = tier.in_place.table
        if not self.cuda:
            flat = ids.reshape(-1)
            pairs = (table[flat] == tier.cpu_row).nonzero().flatten()
            if pairs.numel():
                acc.add_(tier.cpu_sum(y, (pairs // k).tolist(), flat[pairs].tolist(),
                                      weights.reshape(-1)[pairs].tolist()))
            return
        job = self._job(tier, rows, k, y.dtype)
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        side = self.stream.cuda_stream
        _copy(self.x, y.contiguous(), side)
        _copy(self.ids, ids.reshape(-1), side)
        _copy(self.weights, weights.reshape(-1), side)
        _copy(self.table, table, side)
        _check(_driver().cuLaunchHostFunc(side, job_function(), ctypes.addressof(job)),
               "cuLaunchHostFunc")
        _copy(self.out_device[:rows], self.out[:rows], side)
        main.wait_stream(self.stream)
        acc.add_(self.out_device[:rows])

    def _job(self, tier, rows: int, k: int, dtype: torch.dtype) -> MoeJob:
        job = self.jobs.get((id(tier), rows))
        if job is None:
            job = self.jobs[(id(tier), rows)] = MoeJob()
        gu, down = tier.host_gu, tier.host_down
        H, I = down.w.shape[1:]
        assert dtype in (torch.bfloat16, torch.float32) and rows * k <= self.ids.numel()
        ptr = {name: t.data_ptr() for name, t in self.scratch.items()}
        for name, value in dict(
                x=self.x.data_ptr(), ids=self.ids.data_ptr(), weights=self.weights.data_ptr(),
                table=self.table.data_ptr(), rows=rows, k=k, H=H, I=I, E=tier.experts,
                x_fp32=int(dtype == torch.float32), cpu_row=tier.cpu_row, threads=self.threads,
                gu=gu.w.data_ptr(), gu_scale=gu.scale.data_ptr(), down=down.w.data_ptr(),
                down_scale=down.scale.data_ptr(), out=self.out.data_ptr(), **ptr).items():
            setattr(job, name, value)
        return job

    def totals(self) -> tuple[int, int, float]:
        """(pairs computed, jobs run, seconds in jobs) over every job so far (CUDA)."""
        jobs = self.jobs.values() if self.active else ()
        return (sum(j.pairs for j in jobs), sum(j.calls for j in jobs),
                sum(j.seconds for j in jobs))
