"""`HostJobs`: the host's cores compute part of the captured decode step's missed experts.

An offloaded layer given a split (`InPlaceReads.hand_misses`: of m missed pairs, how many go to
the host) has, each step, the first that many misses' experts mapped to the tier's zero row for
its own kernels: the device kernels read nothing for them from host memory and add nothing.
Around the layer's expert kernels the step hands those pairs to a worker thread on the host
(`kernels.host_handoff`, `cpu_experts.c`'s worker):

    `post` (after the routing): the split applied to the layer's table; the rows, and per
    routed pair its expert id, weight and table entry, staged in page-locked memory; the
    layer's job posted to the worker, which computes every pair whose entry is the zero row in
    fp32 on the host's cores into page-locked `out`; the device kernels run the layer's other
    experts meanwhile, reading the rest of the misses over the bus;
    `collect` (after them): wait for the worker, add `out` into the layer's fp32 sum, and set
    the split's entries back to -1 - e.

All of it is kernels on the step's stream, captured with the rest of the step into its CUDA
graph. The staging buffers are shared by the layers (a layer's job is collected before the
next one is posted) and sized for `rows` token rows; one job record a (layer, rows), whose
index the graph's post kernel keeps. A job not done within `host_handoff.MAX_POLLS` reads
(~4 s) sets a failure flag that `check` raises on before the next step. Experts whose form
the compiled kernel does not take (bf16, fp32: the CPU reference's tests) are computed inline
by `LayerTier.cpu_sum` instead, on the CPU only.
"""
from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace

import torch

from ..kernels import host_handoff
from ..kernels.cpu_experts import run_job, start_worker, stop_worker, takes

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
MAX_JOBS = 1024  # job records a worker indexes: (MoE layers) × (captured batch sizes)


class MoeJob(ctypes.Structure):
    """`ninfer_moe_job` of cpu_experts.c, field for field."""
    _fields_ = [*((name, _ptr) for name in ("x", "ids", "weights", "entries")),
                *((name, _i64) for name in ("rows", "k", "H", "I", "x_fp32", "cpu_row",
                                            "threads")),
                *((name, _ptr) for name in ("gu", "gu_scale", "down", "down_scale", "xf",
                                            "pair_rows", "pair_experts", "pair_weights", "act",
                                            "out")),
                ("pairs", _i64), ("calls", _i64), ("experts", _i64),
                ("seconds", ctypes.c_double)]


THREADS_ENV = "NINFER_EXPERT_CPU_THREADS"


def default_threads() -> int:
    """The threads a job runs on, the worker's own among them (`cpu_experts_team.h`):
    $NINFER_EXPERT_CPU_THREADS, else three quarters of the cores this process may use, leaving
    at least 4 (and 1 of 2) for the engine's own thread, which launches steps and settles their
    routing, and the server. On the H200's 16-core host 12 beat 8 (1.24x at B = 1, 1.32x at
    B = 8) and 15 lost, as an OpenMP team (bench/results/h200-expert-cpu-threads.md); on the
    H100's 16-core host the spinning team ran 14 threads as fast as 12 and 16 at 0.35x, the
    step's own thread starved (bench/results/h100-expert-offload-split-auto.md)."""
    cores = len(os.sched_getaffinity(0))
    return int(os.environ.get(THREADS_ENV, 0)) or max(1, min(cores - 4, 3 * cores // 4))


def scratch(rows: int, k: int, H: int, I: int) -> dict[str, torch.Tensor]:
    """A job's host scratch for `rows` rows of `k` pairs (`ninfer_moe_job`'s xf .. pair_weights)."""
    return dict(xf=torch.empty(rows, H), act=torch.empty(rows * k, I),
                pair_rows=torch.empty(rows * k, dtype=torch.int64),
                pair_experts=torch.empty(rows * k, dtype=torch.int64),
                pair_weights=torch.empty(rows * k))


def job_record(tier, rows: int, k: int, x_fp32: bool, threads: int, cpu_row: int,
               buffers: dict[str, torch.Tensor]) -> MoeJob:
    """A job over `tier`'s host stacks; `buffers`: x, ids, weights, entries, out and the
    `scratch` (the record holds their addresses: the caller keeps them alive)."""
    gu, down = tier.host_gu, tier.host_down
    H, I = down.w.shape[1:]
    return MoeJob(rows=rows, k=k, H=H, I=I, x_fp32=int(x_fp32), cpu_row=cpu_row,
                  threads=threads, gu=gu.w.data_ptr(), gu_scale=gu.scale.data_ptr(),
                  down=down.w.data_ptr(), down_scale=down.scale.data_ptr(),
                  **{name: t.data_ptr() for name, t in buffers.items()})


def job_seconds(tier, experts: list[int], dtype: torch.dtype, threads: int) -> float:
    """Seconds the compiled job (`ninfer_cpu_moe_job`, on this thread) spends on one `dtype`
    row routed to `experts` of `tier`'s host store, by its own clock: what a layer-step's job
    costs the worker, without the Python around a call."""
    H, I = tier.host_down.w.shape[1:]
    k = len(experts)
    buffers = dict(x=torch.zeros(1, H, dtype=dtype),
                   ids=torch.tensor(experts, dtype=torch.int64),
                   entries=torch.ones(k, dtype=torch.int64),  # every pair the job's (row 1)
                   weights=torch.ones(k), out=torch.empty(1, H), **scratch(1, k, H, I))
    job = job_record(tier, 1, k, dtype == torch.float32, threads, 1, buffers)
    run_job(job)
    return job.seconds


def marked_tiers(layers: list[dict]) -> list:
    return [lay["tier"] for lay in layers
            if getattr(getattr(lay.get("tier"), "in_place", None), "split", None) is not None]


class HostJobs:
    """See the module docstring: `rows` token rows at most, over the MoE layers of `layers`
    (`HybridWeights.layers`) whose tiers hand misses to the host (`hand_misses`)."""

    def __init__(self, layers: list[dict], rows: int, device, threads: int | None = None):
        tiers = marked_tiers(layers)
        self.device = torch.device(device)
        self.active = bool(tiers)
        self.worker = None
        if not tiers:
            return
        self.compiled = all(takes(t.host_gu, t.host_down) for t in tiers)
        assert self.compiled or self.device.type == "cpu", \
            "host jobs on CUDA: fp8-row experts only (the compiled kernel's form)"
        t = tiers[0]
        H, I = t.host_down.w.shape[1:]
        k = max(lay["moe"].top_k + 1 for lay in layers if lay.get("tier") in tiers)
        self.threads = threads or default_threads()
        pin = dict(pin_memory=self.device.type == "cuda")
        self.x = torch.empty(rows * H * 4, dtype=torch.uint8, **pin)  # bf16 or fp32 rows
        self.ids = torch.empty(rows * k, dtype=torch.int64, **pin)
        self.weights = torch.empty(rows * k, dtype=torch.float32, **pin)
        self.entries = torch.empty(rows * k, dtype=torch.int64, **pin)
        self.out = torch.zeros(rows, H, dtype=torch.float32, **pin)
        self.ctrl = torch.zeros(host_handoff.JOBS + MAX_JOBS, dtype=torch.int64, **pin)
        self.failed = torch.zeros(1, dtype=torch.int32, **pin)
        self.need = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.scratch = scratch(rows, k, H, I)
        self.jobs: dict[tuple[int, int], tuple[int, MoeJob]] = {}
        self.posted: torch.Tensor | None = None  # the ids of the layer posted last
        if self.compiled:
            self.worker = start_worker(self.ctrl)
        else:  # the inline path's counts, one record a tier (`InPlaceReads._fold` reads them)
            for t in tiers:
                t.in_place.jobs.append(SimpleNamespace(pairs=0, experts=0))

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self.worker is not None:
            stop_worker(self.ctrl, self.worker)
            self.worker = None

    def __del__(self) -> None:
        self.close()

    def post(self, tier, y: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
        """Hand the host's share of `tier`'s misses in routing `ids`/`weights` `[rows, k]` over
        rows `y [rows, H]` to the worker (see the module docstring); nothing where `tier`
        hands none (no split, or `auto`'s policy has the hand-off off)."""
        split = tier.in_place.split
        if not self.active or not tier.in_place.handing:
            return
        rows, k = weights.shape
        table, flat = tier.in_place.table, ids.reshape(-1)
        self.posted = flat
        if not self.compiled:  # the CPU reference's bf16 / fp32 stacks: inline, in torch
            host_handoff.split_misses(flat, table, split, tier.cpu_row)
            pairs = (table[flat] == tier.cpu_row).nonzero().flatten()
            self.out[:rows].zero_()
            if pairs.numel():
                experts = flat[pairs].tolist()
                self.out[:rows] = tier.cpu_sum(y, (pairs // k).tolist(), experts,
                                               weights.reshape(-1)[pairs].tolist())
                record = tier.in_place.jobs[0]
                record.pairs += len(experts)
                record.experts += len(set(experts))
            return
        index, job = self._job(tier, rows, k, y.dtype)
        n = rows * y.shape[1]
        x = self.x[: n * y.element_size()].view(y.dtype)
        host_handoff.stage_pairs(y.contiguous(), flat, weights.reshape(-1), table, tier.cpu_row,
                                 (x, self.ids, self.weights, self.entries), self.need, split)
        host_handoff.post(self.ctrl, self.need, index)

    def collect(self, tier, acc: torch.Tensor) -> None:
        """Add the posted job's `out` to `acc [rows, H]` (fp32), once the worker is done; the
        split's table entries back to -1 - e (after the layer's expert kernels)."""
        if not self.active or not tier.in_place.handing:
            return
        rows, table = acc.shape[0], tier.in_place.table
        if not self.compiled:
            acc.add_(self.out[:rows])
            held = table[self.posted] == tier.cpu_row
            table[self.posted[held]] = -1 - self.posted[held]
            return
        host_handoff.wait_done(self.ctrl, self.need, self.failed)
        host_handoff.add_out(self.out[:rows], acc, self.need, self.posted, table, tier.cpu_row)

    def check(self) -> None:
        """Raise where a job was not done in time (the step's sums then lack its pairs)."""
        if self.active and int(self.failed[0]):
            raise RuntimeError("the CPU expert worker did not finish a job within "
                               f"{host_handoff.MAX_POLLS} polls: offloaded experts' output lost")

    def _job(self, tier, rows: int, k: int, dtype: torch.dtype) -> tuple[int, MoeJob]:
        """The job record of (`tier`, `rows`), made and registered with the worker once; only
        its zero row is brought up to date (lending's resizes move it)."""
        key = (id(tier), rows)
        if key not in self.jobs:
            assert len(self.jobs) < MAX_JOBS
            assert dtype in (torch.bfloat16, torch.float32) and rows * k <= self.ids.numel()
            job = job_record(tier, rows, k, dtype == torch.float32, self.threads,
                             tier.cpu_row, dict(x=self.x, ids=self.ids, weights=self.weights,
                                                entries=self.entries, out=self.out,
                                                **self.scratch))
            self.jobs[key] = (len(self.jobs), job)
            self.ctrl[host_handoff.JOBS + len(self.jobs) - 1] = ctypes.addressof(job)
            tier.in_place.jobs.append(job)
        index, job = self.jobs[key]
        job.cpu_row = tier.cpu_row
        return index, job

    def totals(self) -> tuple[int, int, float]:
        """(pairs computed, jobs run, seconds in jobs) over every job so far (compiled)."""
        jobs = [job for _, job in self.jobs.values()] if self.active else []
        return (sum(j.pairs for j in jobs), sum(j.calls for j in jobs),
                sum(j.seconds for j in jobs))
