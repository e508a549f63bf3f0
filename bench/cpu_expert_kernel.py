"""One MoE layer's missed experts computed on the host's cores: the compiled fp8-row kernel
(`kernels/cpu_experts.c`) against the torch path it replaced (codes decoded through a table
into fp32, then two matmuls), at Flash-Next's expert shape (I 512, H 2048, fp8-row).

    python3 bench/cpu_expert_kernel.py [--pairs 1 5 10] [--out bench/results/cpu-expert-kernel]

`--pairs`: (row, expert) pairs a call computes, each a different expert (5: half of a
uniform token's top-10 missed). Prints and writes ms a call and the GB/s of expert bytes read.
"""
from __future__ import annotations

import argparse
import json
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
from ninfer_engine.kernels.cpu_experts import fp8_experts, use_avx512  # noqa: E402
from ninfer_engine.models.experts import ExpertStack  # noqa: E402

I, H = 512, 2048


def time_ms(fn, n: int) -> float:
    """Median ms of `n` calls after one warm-up call (host work: wall clock)."""
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[1, 5, 10])
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    E = max(args.experts, max(args.pairs))
    gu = ExpertStack((torch.randn(E, 2 * I, H, generator=gen) * 64).to(torch.float8_e4m3fn),
                     (torch.rand(E, 2 * I, generator=gen) / 64).to(torch.bfloat16))
    dn = ExpertStack((torch.randn(E, H, I, generator=gen) * 64).to(torch.float8_e4m3fn),
                     (torch.rand(E, H, generator=gen) / 64).to(torch.bfloat16))
    expert_bytes = gu.expert_bytes + dn.expert_bytes
    x = torch.randn(1, H, generator=gen)

    def torch_path(experts):
        out = torch.zeros(1, H)
        for e in experts:
            h = F.linear(x, _host_fp32(gu.member(e)))
            out += F.linear(F.silu(h[:, :I]) * h[:, I:], _host_fp32(dn.member(e)))
        return out

    rows = []
    for n in args.pairs:
        experts = [(3 * j) % E for j in range(n)]  # distinct experts, spread over the stack

        def compiled_ms(wide: bool) -> float | None:
            if use_avx512(wide) != wide:
                return None  # no AVX-512 here
            return time_ms(lambda: fp8_experts(x, [0] * n, experts, [1.0] * n, gu, dn,
                                               torch.zeros(1, H)), 20)
        avx2 = compiled_ms(False)
        avx512 = compiled_ms(True)
        compiled = avx512 or avx2
        reference = time_ms(lambda: torch_path(experts), 5)
        gbps = n * expert_bytes / compiled / 1e6
        rows.append(dict(pairs=n, compiled_ms=compiled, avx2_ms=avx2, avx512_ms=avx512,
                         torch_ms=reference, compiled_gbps=gbps, speedup=reference / compiled))
        print(f"{n:3d} pairs: compiled {compiled:.3f} ms ({gbps:.1f} GB/s of expert bytes; "
              f"AVX2 {avx2:.3f} ms), torch {reference:.3f} ms, {reference / compiled:.1f}x")
    if args.out:
        result = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      command=" ".join(sys.argv), machine=dict(
                          cpu=_cpu_name(), cores=os.cpu_count(),
                          torch=torch.__version__, threads=torch.get_num_threads()),
                      expert_bytes=expert_bytes, shape=dict(I=I, H=H), rows=rows)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))
        lines = [f"# Missed experts on the host's cores: compiled fp8-row kernel vs torch", "",
                 f"{result['date']}, {result['machine']['cpu']}, {os.cpu_count()} cores, torch "
                 f"{torch.__version__}; `{result['command']}`. One Flash-Next expert (I {I}, "
                 f"H {H}, fp8-row): {expert_bytes / 1e6:.2f} MB.", "",
                 "| pairs | compiled ms | GB/s | AVX2 ms | AVX-512 ms | torch ms | × |",
                 "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['pairs']} | {r['compiled_ms']:.3f} | {r['compiled_gbps']:.1f} "
                  f"| {r['avx2_ms']:.3f} | "
                  + ("—" if r["avx512_ms"] is None else f"{r['avx512_ms']:.3f}")
                  + f" | {r['torch_ms']:.3f} | {r['speedup']:.1f} |" for r in rows]
        lines += ["", "compiled: AVX-512 where the CPU has it (the kernel's default), else "
                  "AVX2; both dot products timed in turn on the same experts."]
        Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
