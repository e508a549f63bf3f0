"""Tile sweep of the fused MoE decode kernels as the decode step runs them, CUDA only.

    python3 bench/moe_slot_sweep.py --out bench/results/h200-moe-slots.json [--budget 150]

Shapes: 35B-A3B (E = 256 + the shared expert, top-8 + 1 slot, H 2048, I 512, bf16) and the
80B-A3B Flash-Next class (E = 512 + 1, top-10 + 1, fp8-row). Unlike bench/moe_fused_sweep.py,
whose calls re-read one layer's experts from the L2, every timed call here reads another
layer's stack (`--layers` copies, > the 50 MB L2 in all) with its own random top-k, as a decode
step does; each call is timed inside one CUDA graph of back-to-back calls over the copies.
For gate|up + SiLU (`moe_gate_up_silu_triton`) and down + combine (`moe_down_combine_triton`)
at B = 1 and 4: every (block, BK, warps) of the grid, the engine's default, the bytes of the
distinct experts read and the TB/s; all rows go to `--out`, the best per (shape, kernel, B)
beside the default tile to the `.md` beside it (and stdout).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import copy_bandwidth_gbps, graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.moe_fused import (moe_down_combine_triton,  # noqa: E402
                                             moe_gate_up_silu_triton)

SHAPES = {"35b-a3b": dict(E=257, k=9, H=2048, I=512, fp8=False),
          "flash-next-fp8": dict(E=513, k=11, H=2048, I=512, fp8=True)}
GATE_UP_GRID = dict(block_i=(8, 16, 32), block_k=(256, 512), num_warps=(4, 8))
DOWN_GRID = dict(block_h=(4, 8, 16, 32), block_k=(256, 512), num_warps=(2, 4, 8))


def _layers(E, k, H, I, fp8, n, B):
    """n layers of (gate_up, gu_scale, down, down_scale, ids, weights) with random routing;
    the last slot of every row is the shared expert (E - 1)."""
    out = []
    for _ in range(n):
        gu = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) / H ** 0.5
        dn = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) / I ** 0.5
        gs = ds = None
        if fp8:
            gs = gu.abs().amax(-1).float().clamp_min(1e-8) / 448
            ds = dn.abs().amax(-1).float().clamp_min(1e-8) / 448
            gu = (gu / gs[..., None]).to(torch.float8_e4m3fn)
            dn = (dn / ds[..., None]).to(torch.float8_e4m3fn)
            gs, ds = gs.bfloat16(), ds.bfloat16()
        ids = torch.stack([torch.cat([torch.randperm(E - 1, device="cuda")[: k - 1],
                                      torch.tensor([E - 1], device="cuda")]) for _ in range(B)])
        w = torch.rand(B, k, device="cuda")
        out.append((gu, gs, dn, ds, ids.view(-1), w / w.sum(-1, keepdim=True)))
    return out


def _time_us(calls) -> float:
    """µs per call of `calls` (one closure per layer) replayed from one CUDA graph."""
    graph = graph_of(lambda: [c() for c in calls])
    return time_ms(graph.replay, 10) * 1e3 / len(calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--budget", type=float, default=150.0)
    args = ap.parse_args()
    t0, rows = time.time(), []
    gbps = copy_bandwidth_gbps()
    for name, s in SHAPES.items():
        E, k, H, I, fp8 = s["E"], s["k"], s["H"], s["I"], s["fp8"]
        elem = 1 if fp8 else 2
        for B in (1, 4):
            layers = _layers(E, k, H, I, fp8, args.layers, B)
            x = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
            act = torch.randn(B * k, I, device="cuda", dtype=torch.bfloat16)
            distinct = sum(len(set(L[4].tolist())) for L in layers) / len(layers)
            bytes_gu, bytes_dn = distinct * 2 * I * H * elem, distinct * H * I * elem
            for kernel, grid in (("gate_up", GATE_UP_GRID), ("down", DOWN_GRID)):
                for combo in [None, *itertools.product(*grid.values())]:
                    if time.time() - t0 > args.budget:
                        break
                    kw = {} if combo is None else dict(zip(grid, combo))
                    if kernel == "gate_up":
                        calls = [lambda L=L: moe_gate_up_silu_triton(x, L[0], L[4], scale=L[1],
                                                                     **kw) for L in layers]
                    else:
                        calls = [lambda L=L: moe_down_combine_triton(act, L[2], L[4], L[5], B, k,
                                                                     scale=L[3], **kw)
                                 for L in layers]
                    try:
                        us = _time_us(calls)
                    except Exception as err:  # a tile the compiler refuses: recorded, skipped
                        rows.append(dict(shape=name, kernel=kernel, B=B, kw=kw, error=str(err)))
                        continue
                    nbytes = bytes_gu if kernel == "gate_up" else bytes_dn
                    rows.append(dict(shape=name, kernel=kernel, B=B, kw=kw, default=combo is None,
                                     us=us, tbps=nbytes / us / 1e6,
                                     copy_frac=nbytes / us / 1e3 / gbps))
            del layers
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                copy_gbps=gbps, layers=args.layers, seconds=time.time() - t0,
                command=" ".join(["python3", "bench/moe_slot_sweep.py", *sys.argv[1:]]),
                date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    table = markdown(meta, rows)
    Path(args.out).with_suffix(".md").write_text(table)
    print(table)


def markdown(meta: dict, rows: list[dict]) -> str:
    """The best tile per (shape, kernel, B) beside the engine's default tile of the run."""
    ok = [r for r in rows if "us" in r]
    lines = [f"# Fused MoE decode kernels, tile sweep ({meta['gpu']}, torch {meta['torch']})", "",
             f"- command: `{meta['command']}`, {meta['date']}",
             f"- every call reads another of {meta['layers']} layer copies (random top-k plus the "
             f"shared expert as the last slot), timed in one CUDA graph of back-to-back calls; "
             f"copy bandwidth measured in the run: {meta['copy_gbps']:.0f} GB/s",
             "- bytes: the distinct experts of a call (weights, not scales); % of copy = their "
             "read rate over the copy bandwidth", "",
             "| shape | kernel | B | default µs | best tile (block, BK, warps) | µs | % of copy "
             "| × default |", "|---|---|---|---|---|---|---|---|"]
    for key in sorted({(r["shape"], r["kernel"], r["B"]) for r in ok}):
        mine = [r for r in ok if (r["shape"], r["kernel"], r["B"]) == key]
        best = min(mine, key=lambda r: r["us"])
        default = next(r for r in mine if r["default"])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {default['us']:.1f} | "
                     f"{tuple(best['kw'].values())} | {best['us']:.1f} | "
                     f"{100 * best['copy_frac']:.0f} % | {default['us'] / best['us']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
