"""One MoE layer's missed experts computed on the host's cores: the compiled fp8-row kernel
(`kernels/cpu_experts.c`) in each form this CPU runs (AVX2, AVX-512, the bf16 tables) against
the torch path it replaced (codes decoded through a table into fp32, then two matmuls), at
Flash-Next's expert shape (I 512, H 2048, fp8-row), on a bf16 input row as the captured step
stages it.

    python3 bench/cpu_expert_kernel.py [--pairs 1 5 10] [--threads T ...]
        [--prefetch BYTES ...] [--memory plain|pinned|huge|huge-pinned ...]
        [--out bench/results/cpu-expert-kernel]

`--pairs`: (row, expert) pairs a call computes, each a different expert (5: half of a
uniform token's top-10 missed); `--experts`: the stack they are drawn from (calls rotate over
it, so past the last-level cache the codes come from memory). `--prefetch`: the kernel's
prefetch distances (`use_prefetch`); `--memory`: where the stacks live (torch's allocator,
page-locked by CUDA as the engine's host store is, anonymous memory advised into 2 MiB pages,
those pages registered with CUDA). Each (memory, form, distance) is timed in turn, a few calls
a round. Prints and writes ms a call and the GB/s of expert bytes read, beside a read of the
same memory by torch's threads (`read GB/s`: a ceiling for the team).
"""
from __future__ import annotations

import argparse
import itertools
import json
import mmap
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.experts.host_compute import _host_fp32  # noqa: E402
from ninfer_engine.kernels.cpu_experts import (  # noqa: E402
    ISAS, fp8_experts, use_isa, use_prefetch)
from ninfer_engine.models.experts import ExpertStack  # noqa: E402

I, H = 512, 2048
ROUNDS = 12


def time_ms(fn, n: int) -> float:
    """Median ms of `n` calls after one warm-up call (host work: wall clock)."""
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


HUGE = 2 << 20
MEMORY = ("plain", "pinned", "huge", "huge-pinned")


def _buffer(nbytes: int, memory: str) -> torch.Tensor:
    """`nbytes` of host memory of the kind `memory` names (see the module docstring)."""
    if memory in ("plain", "pinned"):
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=memory == "pinned")
    mm = mmap.mmap(-1, nbytes + HUGE)
    mm.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mm, dtype=torch.uint8)  # (keeps `mm` alive)
    buf = whole[-whole.data_ptr() % HUGE:][:nbytes]
    if memory == "huge-pinned":
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0)
        assert int(err) == 0, f"cudaHostRegister: {err}"
    return buf


def _placed(stacks: list[ExpertStack], memory: str) -> list[ExpertStack]:
    """`stacks` copied into one buffer of `memory`."""
    planes = [p for s in stacks for p in (s.w, s.scale)]
    sizes = [-(-p.nbytes // 64) * 64 for p in planes]
    buf = _buffer(sum(sizes), memory)
    out, at = [], 0
    for p, n in zip(planes, sizes):
        view = buf[at: at + p.nbytes].view(p.dtype).view(p.shape)
        view.copy_(p)
        out.append(view)
        at += n
    return [ExpertStack(out[i], out[i + 1]) for i in range(0, len(out), 2)]


def _read_gbps(stacks: list[ExpertStack], threads: int) -> float:
    """GB/s of torch summing the stacks' codes on `threads` threads (median of 5)."""
    codes = [s.w.view(torch.uint8).view(-1)[: s.w.numel() // 8 * 8].view(torch.int64)
             for s in stacks]
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    ms = time_ms(lambda: [c.sum() for c in codes], 5)
    torch.set_num_threads(before)
    return sum(c.nbytes for c in codes) / ms / 1e6


def _anon_huge_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("AnonHugePages"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[1, 5, 10])
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--threads", type=int, nargs="+", default=[0],
                    help="OpenMP teams to time (0: its default)")
    ap.add_argument("--prefetch", type=int, nargs="+", default=[use_prefetch(-1)])
    ap.add_argument("--memory", nargs="+", default=["plain"], choices=MEMORY)
    ap.add_argument("--isas", nargs="+", default=list(ISAS), choices=ISAS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    E = max(args.experts, max(args.pairs))
    gu = ExpertStack((torch.randn(E, 2 * I, H, generator=gen) * 64).to(torch.float8_e4m3fn),
                     (torch.rand(E, 2 * I, generator=gen) / 64).to(torch.bfloat16))
    dn = ExpertStack((torch.randn(E, H, I, generator=gen) * 64).to(torch.float8_e4m3fn),
                     (torch.rand(E, H, generator=gen) / 64).to(torch.bfloat16))
    expert_bytes = gu.expert_bytes + dn.expert_bytes
    x = torch.randn(1, H, generator=gen).to(torch.bfloat16)

    def torch_path(experts):
        out = torch.zeros(1, H)
        for e in experts:
            h = F.linear(x.float(), _host_fp32(gu.member(e)))
            out += F.linear(F.silu(h[:, :I]) * h[:, I:], _host_fp32(dn.member(e)))
        return out

    huge_before = _anon_huge_mb()
    placed = {m: _placed([gu, dn], m) for m in args.memory}
    huge_mb = _anon_huge_mb() - huge_before
    isas = [isa for isa in args.isas if use_isa(isa) == isa]  # the forms this CPU runs
    variants = list(itertools.product(args.memory, isas, args.prefetch))
    rows = []
    for threads, n in itertools.product(args.threads, args.pairs):
        calls = [[(3 * j + c * n) % E for j in range(n)] for c in range(max(1, E // n))]
        turn = itertools.count()

        def call(stacks):
            fp8_experts(x, [0] * n, calls[next(turn) % len(calls)], [1.0] * n, *stacks,
                        torch.zeros(1, H), threads)
        # the variants in turn, a few calls each, over several rounds (a shared host drifts)
        times = {v: [] for v in variants}
        for _ in range(ROUNDS):
            for memory, isa, prefetch in variants:
                use_isa(isa)
                use_prefetch(prefetch)
                times[(memory, isa, prefetch)].append(
                    time_ms(lambda: call(placed[memory]), 3))
        use_isa(ISAS[-1])
        use_prefetch(args.prefetch[0])
        reference = time_ms(lambda: torch_path(calls[0]), 5)
        reads = {m: _read_gbps(placed[m], threads) for m in args.memory}
        for (memory, isa, prefetch), t in times.items():
            ms = statistics.median(t)
            gbps = n * expert_bytes / ms / 1e6
            rows.append(dict(threads=threads, pairs=n, memory=memory, isa=isa,
                             prefetch=prefetch, ms=ms, gbps=gbps, read_gbps=reads[memory],
                             torch_ms=reference))
            print(f"{threads:2d} threads, {n:3d} pairs, {memory:11s} {isa:11s} prefetch "
                  f"{prefetch:5d}: {ms:.3f} ms, {gbps:.1f} GB/s (read {reads[memory]:.1f}), "
                  f"torch {reference / ms:.0f}x slower")
    if args.out:
        result = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      command=" ".join(sys.argv), machine=dict(
                          cpu=_cpu_name(), cores=os.cpu_count(),
                          torch=torch.__version__),
                      expert_bytes=expert_bytes, shape=dict(I=I, H=H), rows=rows,
                      anon_huge_mb=huge_mb)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))
        lines = ["# Missed experts on the host's cores: compiled fp8-row kernel vs torch", "",
                 f"{result['date']}, {result['machine']['cpu']}, {os.cpu_count()} cores, torch "
                 f"{torch.__version__}; `{result['command']}`. One Flash-Next expert (I {I}, "
                 f"H {H}, fp8-row): {expert_bytes / 1e6:.2f} MB; calls rotate over "
                 f"{E} experts ({E * expert_bytes / 1e6:.0f} MB); a bf16 input row. "
                 f"2 MiB pages the stacks gained: {huge_mb:.0f} MB.", "",
                 "| threads | pairs | memory | form | prefetch B | ms | GB/s | read GB/s | "
                 "torch ms |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['threads'] or 'default'} | {r['pairs']} | {r['memory']} | {r['isa']} "
                  f"| {r['prefetch']} | {r['ms']:.3f} | {r['gbps']:.1f} | {r['read_gbps']:.1f} "
                  f"| {r['torch_ms']:.3f} |" for r in rows]
        lines += ["", "avx2 / avx512: the fp16 decode (`cpu_experts.c`); avx512-bf16: the "
                  "bf16 tables (`cpu_experts_bf16.h`, VBMI + BF16), which also round the "
                  "activations between the projections to bf16. `read GB/s`: torch's threads "
                  "summing the same codes as int64."]
        Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
