"""One MoE layer's missed experts computed on the host's cores: the compiled fp8-row kernel
(`kernels/cpu_experts.c`) in each form this CPU runs (AVX2, AVX-512, the bf16 tables) against
the torch path it replaced (codes decoded through a table into fp32, then two matmuls), at
Flash-Next's expert shape (I 512, H 2048, fp8-row), on a bf16 input row as the captured step
stages it.

    python3 bench/cpu_expert_kernel.py [--pairs 1 5 10] [--threads T ...]
                                       [--out bench/results/cpu-expert-kernel]

`--pairs`: (row, expert) pairs a call computes, each a different expert (5: half of a
uniform token's top-10 missed); `--experts`: the stack they are drawn from (calls rotate over
it, so past the last-level cache the codes come from memory). Prints and writes ms a call
and the GB/s of expert bytes read.
"""
from __future__ import annotations

import argparse
import itertools
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
from ninfer_engine.kernels.cpu_experts import ISAS, fp8_experts, use_isa  # noqa: E402
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

    rows = []
    for threads, n in itertools.product(args.threads, args.pairs):
        calls = [[(3 * j + c * n) % E for j in range(n)] for c in range(max(1, E // n))]

        turn = itertools.count()

        def call():
            fp8_experts(x, [0] * n, calls[next(turn) % len(calls)], [1.0] * n, gu, dn,
                        torch.zeros(1, H), threads)
        # the forms in turn, a few calls each, over several rounds (a shared host drifts)
        forms = {isa: [] if use_isa(isa) == isa else None for isa in ISAS}
        for _ in range(ROUNDS):
            for isa, times in forms.items():
                if times is not None:
                    use_isa(isa)
                    times.append(time_ms(call, 3))
        forms = {isa: None if t is None else statistics.median(t) for isa, t in forms.items()}
        use_isa(ISAS[-1])
        best = min(t for t in forms.values() if t is not None)
        reference = time_ms(lambda: torch_path(calls[0]), 5)
        gbps = n * expert_bytes / best / 1e6
        rows.append(dict(threads=threads, pairs=n, forms_ms=forms, best_ms=best, best_gbps=gbps,
                         torch_ms=reference, speedup=reference / best))
        print(f"{threads} threads, {n:3d} pairs: " + ", ".join(
            f"{isa} {'—' if t is None else f'{t:.3f} ms'}" for isa, t in forms.items())
            + f" ({gbps:.1f} GB/s of expert bytes at best), torch {reference:.3f} ms, "
            f"{reference / best:.1f}x")
    if args.out:
        result = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      command=" ".join(sys.argv), machine=dict(
                          cpu=_cpu_name(), cores=os.cpu_count(),
                          torch=torch.__version__),
                      expert_bytes=expert_bytes, shape=dict(I=I, H=H), rows=rows)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))
        lines = ["# Missed experts on the host's cores: compiled fp8-row kernel vs torch", "",
                 f"{result['date']}, {result['machine']['cpu']}, {os.cpu_count()} cores, torch "
                 f"{torch.__version__}; `{result['command']}`. One Flash-Next expert (I {I}, "
                 f"H {H}, fp8-row): {expert_bytes / 1e6:.2f} MB; calls rotate over "
                 f"{E} experts ({E * expert_bytes / 1e6:.0f} MB); a bf16 input row.", "",
                 "| threads | pairs | " + " ms | ".join(ISAS)
                 + " ms | GB/s (best) | torch ms | × |",
                 "|---|---|" + "---|" * (len(ISAS) + 3)]
        lines += [f"| {r['threads'] or 'default'} | {r['pairs']} | " + " | ".join(
            "—" if t is None else f"{t:.3f}" for t in r["forms_ms"].values())
            + f" | {r['best_gbps']:.1f} | {r['torch_ms']:.3f} | {r['speedup']:.1f} |"
            for r in rows]
        lines += ["", "avx2 / avx512: the fp16 decode (`cpu_experts.c`); avx512-bf16: the "
                  "bf16 tables (`cpu_experts_bf16.h`, VBMI + BF16), which also round the "
                  "activations between the projections to bf16; — : not on this CPU."]
        Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
