"""Host memory shared by the bus and the cores (issue 20): missed Flash-Next experts read in
place over PCIe by the expert kernels, computed on the host's cores by the compiled kernel,
each alone and both at once; and what a captured host function costs a step.

    OUT=$OUT python3 bench/host_contention.py --out bench/results/h200-host-contention

- GPU: CUDA graphs of the gate|up and down kernels at B = 1 over 8 experts read from a
  page-locked store of `--experts` (more than the host's L3 holds), each graph its own 8,
  replayed round-robin: GB/s of expert bytes.
- CPU: `fp8_experts` over 5 distinct experts a call (half a uniform token's top-10), rotating
  over the same store, `--threads` OpenMP threads, a bf16 row as the step stages it (the
  widest form the CPU runs: the bf16 tables where it has VBMI and BF16): GB/s.
- Both: the GPU replays queued for as long as the CPU loop runs, each rate over the overlap.
- Hand-off: a captured graph of 16 tiny kernels against the same graph with a layer's hand-off
  to the worker thread after each (`kernels.host_handoff`, a job with no pairs), and with a
  CUDA host function instead (a side-stream fork, `cuLaunchHostFunc`, a join): µs a layer.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.experts.host_jobs import MoeJob, default_threads  # noqa: E402
from ninfer_engine.kernels.cpu_experts import (_library, fp8_experts, start_worker,  # noqa: E402
                                               stop_worker)
from ninfer_engine.kernels.host_handoff import (JOBS, add_out, post, stage_pairs,  # noqa: E402
                                                wait_done)
from ninfer_engine.kernels.moe_down import moe_down_combine_triton  # noqa: E402
from ninfer_engine.kernels.moe_fused import Remap, moe_gate_up_silu_triton  # noqa: E402
from ninfer_engine.models.experts import ExpertStack  # noqa: E402

I, H, K = 512, 2048, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    E = args.experts
    gen = torch.Generator().manual_seed(0)
    gu = ExpertStack(torch.randint(0, 120, (E, 2 * I, H), dtype=torch.uint8, generator=gen)
                     .view(torch.float8_e4m3fn).pin_memory(),
                     (torch.rand(E, 2 * I, generator=gen) / 64).to(torch.bfloat16).pin_memory())
    dn = ExpertStack(torch.randint(0, 120, (E, H, I), dtype=torch.uint8, generator=gen)
                     .view(torch.float8_e4m3fn).pin_memory(),
                     (torch.rand(E, H, generator=gen) / 64).to(torch.bfloat16).pin_memory())
    expert_bytes = gu.expert_bytes + dn.expert_bytes
    slots = [torch.empty((1, *t.shape[1:]), dtype=t.dtype, device="cuda")
             for t in (gu.w, gu.scale, dn.w, dn.scale)]

    def off(host, dev):
        return (host.data_ptr() - dev.data_ptr()) // host.element_size()
    table = torch.tensor([-1 - e for e in range(E + 1)], device="cuda")
    r_gu = Remap(table, off(gu.w, slots[0]), off(gu.scale, slots[1]))
    r_dn = Remap(table, off(dn.w, slots[2]), off(dn.scale, slots[3]))
    x = torch.randn(1, H, device="cuda").to(torch.bfloat16)
    w = torch.rand(1, K, device="cuda")
    graphs = []
    for g in range(E // K):
        ids = torch.arange(g * K, (g + 1) * K, device="cuda")
        act = moe_gate_up_silu_triton(x, slots[0], ids, scale=slots[1], remap=r_gu)
        moe_down_combine_triton(act, slots[2], ids, w, 1, K, scale=slots[3], remap=r_dn)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            act = moe_gate_up_silu_triton(x, slots[0], ids, scale=slots[1], remap=r_gu)
            moe_down_combine_triton(act, slots[2], ids, w, 1, K, scale=slots[3], remap=r_dn)
        graphs.append(graph)
    torch.cuda.synchronize()

    def gpu(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            graphs[i % len(graphs)].replay()
        torch.cuda.synchronize()
        return n * K * expert_bytes / (time.perf_counter() - start) / 1e9

    xc, out = torch.randn(1, H).to(torch.bfloat16), torch.zeros(1, H)

    def cpu(seconds: float) -> tuple[float, int]:
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            experts = [(5 * calls + j) % E for j in range(5)]
            fp8_experts(xc, [0] * 5, experts, [1.0] * 5, gu, dn, out, args.threads)
            calls += 1
        return calls * 5 * expert_bytes / (time.perf_counter() - start) / 1e9, calls

    gpu(64)
    cpu(0.3)
    gpu_alone = gpu(2000)
    cpu_alone, _ = cpu(args.seconds)
    # both: queue enough replays to outlast the CPU loop, then time each over the overlap
    per_replay = K * expert_bytes / gpu_alone / 1e9
    n = int(args.seconds / per_replay * 1.5)
    started = torch.cuda.Event(enable_timing=True)
    ended = torch.cuda.Event(enable_timing=True)
    started.record()
    for i in range(n):
        graphs[i % len(graphs)].replay()
    ended.record()
    cpu_both, _ = cpu(args.seconds)
    ended.synchronize()
    gpu_both = n * K * expert_bytes / (started.elapsed_time(ended) / 1e3) / 1e9
    result = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  command=" ".join(sys.argv), device=torch.cuda.get_device_name(),
                  experts=E, threads=args.threads, expert_mb=expert_bytes / 1e6,
                  gpu_alone_gbps=gpu_alone, cpu_alone_gbps=cpu_alone,
                  gpu_with_cpu_gbps=gpu_both, cpu_with_gpu_gbps=cpu_both,
                  **handoff_us())
    print(json.dumps(result, indent=1))
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))


def handoff_us(layers: int = 16, replays: int = 200) -> dict:
    """µs a layer's hand-off to the worker thread adds to a captured step (stage, post, wait,
    add: `kernels.host_handoff`, a job of 8 pairs whose expert is not there: the worker
    wakes, scans and writes zeros) and, for comparison, what a CUDA host
    function does (a side-stream fork, `cuLaunchHostFunc` of the same job, a join)."""
    pin = dict(pin_memory=True)
    y = torch.randn(1, H, device="cuda").to(torch.bfloat16)
    ids = torch.zeros(K, dtype=torch.long, device="cuda")
    w = torch.rand(K, device="cuda")
    table = torch.full((4,), -99, dtype=torch.long, device="cuda")
    stage = [torch.empty(H, dtype=torch.bfloat16, **pin), torch.empty(K, dtype=torch.long, **pin),
             torch.empty(K, **pin), torch.empty(K, dtype=torch.long, **pin)]
    out = torch.zeros(1, H, **pin)
    ctrl = torch.zeros(8, dtype=torch.long, **pin)
    failed = torch.zeros(1, dtype=torch.int32, **pin)
    need = torch.ones(1, dtype=torch.int32, device="cuda")  # the table sends pair 0 here
    job = MoeJob(x=stage[0].data_ptr(), ids=stage[1].data_ptr(), weights=stage[2].data_ptr(),
                 entries=stage[3].data_ptr(), rows=1, k=K, H=H, I=I, cpu_row=-98, threads=1,
                 out=out.data_ptr())
    ctrl[JOBS] = ctypes.addressof(job)
    worker = start_worker(ctrl)
    acc = torch.zeros(1, H, device="cuda")
    side = torch.cuda.Stream()
    # the host-function variant: the same job run by the driver's thread
    run = ctypes.cast(_library().ninfer_cpu_moe_job, ctypes.c_void_p).value
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuLaunchHostFunc.argtypes = [ctypes.c_void_p] * 3

    def step(how: str):
        for _ in range(layers):
            acc.add_(1.0)
            if how == "handoff":
                stage_pairs(y, ids, w, table, -99, stage, need)
                post(ctrl, need, 0)
                wait_done(ctrl, need, failed)
                add_out(out, acc, need)
            elif how == "host function":
                side.wait_stream(torch.cuda.current_stream())
                driver.cuLaunchHostFunc(side.cuda_stream, run, ctypes.addressof(job))
                torch.cuda.current_stream().wait_stream(side)
            acc.mul_(0.5)

    times = {}
    for how in ("none", "handoff", "host function"):
        graph = torch.cuda.CUDAGraph()
        step(how)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            step(how)
        graph.replay()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        times[how] = (time.perf_counter() - start) / replays
    stop_worker(ctrl, worker)
    assert not int(failed[0]) and job.calls > 0
    return {f"{how}_us_per_layer": (times[how] - times["none"]) / layers * 1e6
            for how in ("handoff", "host function")}


if __name__ == "__main__":
    main()
