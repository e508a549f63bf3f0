"""A prompt step's routed experts on one GPU: the fp8 stacks decoded to bf16 then
`torch._grouped_mm` (the path before `kernels.moe_grouped`), against the grouped Triton
kernels that read the codes in place, at a real layer's shape and several prompt sizes.

    python3 bench/moe_grouped_bench.py [--arch 35b-a3b] [--tokens 120,955,4096,7640]
        [--block-m 16,64] [--tiles 64x64x64w4s3,128x128x64w8s3,...] [--fp8-tiles ...]
        [--json PATH]

Each variant runs the whole routed part of `SparseMoE.routed` (sort, experts, weights, slot
sum) on random fp8-row stacks; CUDA events over 20 runs after 3 warm-ups. Also prints the
relative difference of the two outputs (both bf16; the kernels round each output once, the
old path each weight, gate, up, SiLU and product). `--tiles`: each kernel alone at each tile
and launch size `BMxBNxBK` `wWARPS` `sSTAGES`, its µs and TFLOP/s, the fastest named per kernel
and token count (a prompt burst's largest kernel time, h200-prompt-burst-35b-a3b-8l-fused.md).
`fp8_act_us`: the kernels with e4m3 activations (`fp8_act`, the row quantization included),
and their difference from the old path; `--fp8-tiles` sweeps their tiles.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.artifact.synth import synth_config  # noqa: E402
from ninfer_engine.kernels.moe_grouped import (  # noqa: E402
    moe_grouped_down, moe_grouped_swiglu, tile_plan)
from ninfer_engine.models.experts import ExpertStack  # noqa: E402
from ninfer_engine.models.swiglu import grouped_experts  # noqa: E402


def fp8_rows(E, N, K, gen):
    w = torch.randn(E, N, K, generator=gen, device="cuda") / K ** 0.5
    scale = (w.abs().amax(-1) / 448).bfloat16()
    return ExpertStack((w / scale.float()[..., None]).to(torch.float8_e4m3fn), scale)


def timed(fn, runs=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs * 1e3  # µs


def parse_tile(spec: str) -> dict:
    """`128x64x64w8s3` -> the tile and launch sizes of one sweep point."""
    sizes, rest = spec.split("w")
    warps, stages = rest.split("s")
    bm, bn, bk = map(int, sizes.split("x"))
    return dict(bm=bm, bn=bn, bk=bk, warps=int(warps), stages=int(stages))


def sweep(specs, x, order, k, counts, weights, gate_up, down, fp8_act=False) -> dict:
    """Each kernel alone at each tile size: µs, TFLOP/s (2 multiply-adds a weight a row);
    `fp8_act`: the e4m3-activation kernels, their row quantization included."""
    T, H = x.shape
    S, I = order.shape[0], gate_up.w.shape[1] // 2
    act = moe_grouped_swiglu(x, order, k, tile_plan(counts, S), gate_up.w, gate_up.scale)
    flops = {"swiglu": 2 * S * 2 * I * H, "down": 2 * S * H * I}
    out = {"swiglu": [], "down": []}
    for spec in specs:
        t = parse_tile(spec)
        tiles = tile_plan(counts, S, t["bm"])
        launch = dict(block_n=t["bn"], block_k=t["bk"], num_warps=t["warps"],
                      num_stages=t["stages"])
        runs = {"swiglu": lambda: moe_grouped_swiglu(x, order, k, tiles, gate_up.w,
                                                     gate_up.scale, **launch, fp8_act=fp8_act),
                "down": lambda: moe_grouped_down(act, order, weights.reshape(-1), tiles, down.w,
                                                 down.scale, **launch, fp8_act=fp8_act)}
        for name, run in runs.items():
            try:
                us = timed(run)
            except Exception as exc:  # a tile the device cannot hold (shared memory)
                out[name].append({"tile": spec, "error": str(exc)[:120]})
                continue
            out[name].append({"tile": spec, "us": round(us, 1),
                              "tflops": round(flops[name] / us / 1e6, 1)})
    for name, points in out.items():
        timed_points = [p for p in points if "us" in p]
        if timed_points:
            best = min(timed_points, key=lambda p: p["us"])
            print(f"  {T} tokens, {name}{' fp8' if fp8_act else ''}: fastest {best['tile']} "
                  f"{best['us']} µs "
                  f"({best['tflops']} TFLOP/s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="35b-a3b")
    ap.add_argument("--tokens", default="120,955,4096,7640")
    ap.add_argument("--block-m", default="16,64")
    ap.add_argument("--tiles", default="", help="comma-separated BMxBNxBKwWsS to sweep")
    ap.add_argument("--fp8-tiles", default="",
                    help="the same for the e4m3-activation kernels (fp8_act)")
    ap.add_argument("--json")
    args = ap.parse_args()
    c = synth_config(args.arch, 1)
    E, k, H, I = (c["num_experts"], c["num_experts_per_tok"], c["hidden_size"],
                  c["moe_intermediate_size"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up, down = fp8_rows(E, 2 * I, H, gen), fp8_rows(E, H, I, gen)
    rows = []
    with torch.inference_mode():
        for T in map(int, args.tokens.split(",")):
            x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
            weights, ids = torch.softmax(torch.randn(T, E, device="cuda", generator=gen),
                                         -1).topk(k, -1)
            weights = weights.bfloat16()
            flat = ids.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = flat.new_zeros(E).index_add_(0, flat, torch.ones_like(flat))

            def before():
                ys = grouped_experts(x[order // k], gate_up, down,
                                     torch.cumsum(counts, 0, dtype=torch.int32), counts)
                ys = ys * weights.reshape(-1)[order, None]
                slots = torch.empty_like(ys)
                slots[order] = ys
                return slots.view(T, k, H).sum(1)

            def after(bm, fp8_act=False):
                tiles = tile_plan(counts, T * k, bm)
                act = moe_grouped_swiglu(x, order, k, tiles, gate_up.w, gate_up.scale,
                                         fp8_act=fp8_act)
                return moe_grouped_down(act, order, weights.reshape(-1), tiles, down.w,
                                        down.scale, fp8_act=fp8_act).view(T, k, H).sum(1)

            ref = before().float()
            row = {"tokens": T, "before_us": round(timed(before), 1)}
            for bm in map(int, args.block_m.split(",")):
                out = after(bm).float()
                row[f"bm{bm}_us"] = round(timed(lambda: after(bm)), 1)
                row[f"bm{bm}_rel_diff"] = ((out - ref).norm() / ref.norm()).item()
            row["auto_us"] = round(timed(lambda: after(None)), 1)
            out = after(None, True).float()
            row["fp8_act_us"] = round(timed(lambda: after(None, True)), 1)
            row["fp8_act_rel_diff"] = ((out - ref).norm() / ref.norm()).item()
            if args.tiles:
                row["tiles"] = sweep(args.tiles.split(","), x, order, k, counts, weights,
                                     gate_up, down)
            if args.fp8_tiles:
                row["fp8_tiles"] = sweep(args.fp8_tiles.split(","), x, order, k, counts,
                                         weights, gate_up, down, fp8_act=True)
            rows.append(row)
            print(row, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "arch": args.arch, "experts": E, "top_k": k, "hidden": H, "width": I,
            "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
