"""Tile sweep of the fused MoE decode kernels as the decode step runs them, CUDA only.

    python3 bench/moe_slot_sweep.py --out bench/results/h200-moe-slots.json [--budget 400]
    python3 bench/moe_slot_sweep.py --list   # the variants it would time (no CUDA needed)

Shapes: 35B-A3B (E = 256 + the shared expert, top-8 + 1 slot, H 2048, I 512, bf16 or fp8-row)
and the 80B-A3B Flash-Next class (E = 512 + 1, top-10 + 1, fp8-row); `--shapes` and
`--batches` pick some (B = 4: a verify row of 1 + 3 tokens at B = 1). Unlike
bench/moe_fused_sweep.py, whose calls re-read one layer's experts from the L2, every timed call
here reads another layer's stack (`--layers` copies, > the 50 MB L2 in all) with its own random
top-k, as a decode step does; each call is timed inside one CUDA graph of back-to-back calls
over the copies.
For gate|up + SiLU (`moe_gate_up_silu_triton`) and down + combine (`moe_down_combine_triton`)
at B = 1 and 4: every (block, BK, warps) of the grid, the engine's default (timed first and
last: its row in the table is the faster of the two), the bytes of the
distinct experts read and the TB/s; all rows go to `--out`, the best per (shape, kernel, B)
beside the default tile to the `.md` beside it (and stdout).

`down_split` (B = 1 and 4): down + combine with `slot_split` S groups of slots (S in 1, 3, k)
and `k_split` chunks of I (1, or 2 where 2·BK ≤ I), each program atomically adding its fp32
partial sums into `out`, an fp32 [B, H] buffer per layer copy, zeroed once before the graph
is captured and never inside the timed loop: the engine's case, which zeroes every layer's
buffer in one launch a decode step (that launch is timed once, separately, and reported: it
is not in the per-call times). With S = k_split = 1 the kernel stores fp32 into `out` (no
atomics). Its default row is the engine's default call (bf16 output, no `out`), the same as
`down`'s. The best tile of each (S, k_split) is timed once more without `out` (zeroed fp32
buffer + kernel + cast to bf16 per call: what a caller without a buffer pays), and every tile's
output on one layer is checked against the default kernel's (`rel_err`).
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
from ninfer_engine.kernels.moe_down import moe_down_combine_triton  # noqa: E402
from ninfer_engine.kernels.moe_fused import moe_gate_up_silu_triton  # noqa: E402

SHAPES = {"35b-a3b": dict(E=257, k=9, H=2048, I=512, fp8=False),
          "35b-a3b-fp8": dict(E=257, k=9, H=2048, I=512, fp8=True),
          "flash-next-fp8": dict(E=513, k=11, H=2048, I=512, fp8=True)}
GATE_UP_GRID = dict(block_i=(8, 16, 32), block_k=(256, 512), num_warps=(4, 8))
DOWN_GRID = dict(block_h=(4, 8, 16, 32), block_k=(256, 512), num_warps=(2, 4, 8))
# "k": the shape's slot count (one slot a program); k_split 2 only where 2·BK ≤ I
DOWN_SPLIT_GRID = dict(slot_split=(1, 3, "k"), block_h=(8, 16, 32, 64), block_k=(256, 512),
                       num_warps=(4, 8), k_split=(1, 2))
KERNELS = ("gate_up", "down", "down_split")
BATCHES = {"gate_up": (1, 4), "down": (1, 4), "down_split": (1, 4)}
ZERO_LAYERS = 48  # the per-step zero fill is timed over this many layers' [B, H] buffers


def variants(kernel: str, s: dict) -> list[dict | None]:
    """The calls' keyword arguments of `kernel` on shape `s`: None (the engine's default call)
    first, then the grid. No CUDA needed (`--list`)."""
    if kernel == "gate_up":
        grid = GATE_UP_GRID
    elif kernel == "down":
        grid = DOWN_GRID
    else:
        grid = dict(DOWN_SPLIT_GRID, slot_split=tuple(
            dict.fromkeys(s["k"] if v == "k" else v for v in DOWN_SPLIT_GRID["slot_split"])))
    out: list[dict | None] = [None]
    for combo in itertools.product(*grid.values()):
        kw = dict(zip(grid, combo))
        if kernel == "down_split":
            assert 1 <= kw["slot_split"] <= s["k"], (kw, s)
            if kw["k_split"] > 1 and kw["block_k"] * kw["k_split"] > s["I"]:
                continue  # a K chunk with no tile: atomics of zeros
        out.append(kw)
    return out


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


def _rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def _split_calls(act, layers, B, k, kw, bufs):
    """down_split closures: into each layer's zeroed fp32 buffer (`bufs`), or without `out`
    (bufs None: a zeroed buffer, the kernel and the cast a call)."""
    if bufs is None:
        return [lambda L=L: moe_down_combine_triton(act, L[2], L[4], L[5], B, k, scale=L[3],
                                                    **kw) for L in layers]
    return [lambda L=L, o=o: moe_down_combine_triton(act, L[2], L[4], L[5], B, k, scale=L[3],
                                                     out=o, **kw)
            for L, o in zip(layers, bufs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON of every row; the .md table beside it")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--budget", type=float, default=400.0,
                    help="seconds; the variants left when it runs out are skipped")
    ap.add_argument("--kernels", default=",".join(KERNELS),
                    help=f"comma-separated subset of {','.join(KERNELS)}")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"comma-separated subset of {','.join(SHAPES)}")
    ap.add_argument("--batches", default="1,4", help="comma-separated subset of 1,4")
    ap.add_argument("--list", action="store_true",
                    help="print the variants each (shape, kernel, B) would time and exit")
    args = ap.parse_args()
    kernels = [kn for kn in args.kernels.split(",") if kn]
    assert kernels and set(kernels) <= set(KERNELS), kernels
    shapes = {n: SHAPES[n] for n in args.shapes.split(",") if n}
    batches = [int(b) for b in args.batches.split(",") if b]
    assert shapes and set(batches) <= {1, 4}, (args.shapes, batches)
    if args.list:
        for name, s in shapes.items():
            for B in batches:
                for kernel in kernels:
                    if B in BATCHES[kernel]:
                        vs = variants(kernel, s)
                        print(f"{name} {kernel} B={B}: {len(vs)} calls (default first), "
                              f"e.g. {vs[1]} .. {vs[-1]}")
        return
    if args.out is None:
        ap.error("--out is required (unless --list)")
    t0, rows, zero_us = time.time(), [], {}
    gbps = copy_bandwidth_gbps()
    for name, s in shapes.items():
        E, k, H, I, fp8 = s["E"], s["k"], s["H"], s["I"], s["fp8"]
        elem = 1 if fp8 else 2
        for B in batches:
            todo = [kn for kn in kernels if B in BATCHES[kn]]
            if not todo:
                continue
            layers = _layers(E, k, H, I, fp8, args.layers, B)
            x = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
            act = torch.randn(B * k, I, device="cuda", dtype=torch.bfloat16)
            distinct = sum(len(set(L[4].tolist())) for L in layers) / len(layers)
            bytes_gu, bytes_dn = distinct * 2 * I * H * elem, distinct * H * I * elem
            for kernel in todo:
                split = kernel == "down_split"
                if split:
                    L = layers[0]  # the default kernel's output, to check each tile's by
                    ref0 = moe_down_combine_triton(act, L[2], L[4], L[5], B, k, scale=L[3])
                    bufs = torch.zeros(len(layers), B, H, device="cuda")  # zeroed once
                    zeros = torch.zeros(ZERO_LAYERS, B, H, device="cuda")
                    zero_us[f"{name} B={B}"] = _time_us([zeros.zero_])
                # the default again last: timed first it also paid the clocks' ramp (its
                # 33.4 µs against 28.2 among the grid, h100-issue-bounds-after-fix.md)
                for kw in [*variants(kernel, s), None]:
                    if time.time() - t0 > args.budget:
                        break
                    combo, kw = kw, kw or {}
                    if kernel == "gate_up":
                        calls = [lambda L=L: moe_gate_up_silu_triton(x, L[0], L[4], scale=L[1],
                                                                     **kw) for L in layers]
                    elif not split or combo is None:  # down, and down_split's default row
                        calls = [lambda L=L: moe_down_combine_triton(act, L[2], L[4], L[5], B, k,
                                                                     scale=L[3], **kw)
                                 for L in layers]
                    else:
                        calls = _split_calls(act, layers, B, k, kw, bufs)
                    try:
                        us = _time_us(calls)
                    except Exception as err:  # a tile the compiler refuses: recorded, skipped
                        rows.append(dict(shape=name, kernel=kernel, B=B, kw=kw, error=str(err)))
                        continue
                    nbytes = bytes_gu if kernel == "gate_up" else bytes_dn
                    row = dict(shape=name, kernel=kernel, B=B, kw=kw, default=combo is None,
                               us=us, tbps=nbytes / us / 1e6, copy_frac=nbytes / us / 1e3 / gbps)
                    if split and combo is not None:
                        check = torch.zeros(B, H, device="cuda")
                        L = layers[0]
                        moe_down_combine_triton(act, L[2], L[4], L[5], B, k, scale=L[3],
                                                out=check, **kw)
                        row.update(out="given", rel_err=_rel(check, ref0))
                    rows.append(row)
                if split:  # each (S, k_split)'s best tile again, without `out`
                    mine = [r for r in rows if (r["shape"], r["kernel"], r["B"]) ==
                            (name, kernel, B) and "us" in r and r.get("out") == "given"]
                    for key in sorted({(r["kw"]["slot_split"], r["kw"]["k_split"])
                                       for r in mine}):
                        if time.time() - t0 > args.budget:
                            break
                        best = min((r for r in mine if (r["kw"]["slot_split"],
                                                        r["kw"]["k_split"]) == key),
                                   key=lambda r: r["us"])
                        us = _time_us(_split_calls(act, layers, B, k, best["kw"], None))
                        rows.append(dict(shape=name, kernel=kernel, B=B, kw=best["kw"],
                                         default=False, out="alloc", us=us,
                                         tbps=bytes_dn / us / 1e6,
                                         copy_frac=bytes_dn / us / 1e3 / gbps))
                    del bufs, zeros
            del layers
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                copy_gbps=gbps, layers=args.layers, seconds=time.time() - t0,
                zero_us=zero_us, zero_layers=ZERO_LAYERS,
                command=" ".join(["python3", "bench/moe_slot_sweep.py", *sys.argv[1:]]),
                date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    table = markdown(meta, rows)
    Path(args.out).with_suffix(".md").write_text(table)
    print(table)


def _tile(r: dict) -> str:
    """A row's tile: (block, BK, warps), with `S=` / `K/` before it for down_split."""
    kw = r["kw"]
    if r["kernel"] != "down_split":
        return str(tuple(kw.values()))
    if not kw:
        return "()"
    ks = f" K/{kw['k_split']}" if kw["k_split"] > 1 else ""
    return f"S={kw['slot_split']}{ks} {(kw['block_h'], kw['block_k'], kw['num_warps'])}"


def markdown(meta: dict, rows: list[dict]) -> str:
    """The best tile per (shape, kernel, B) beside the engine's default tile of the run; for
    down_split also the best per (S, k_split)."""
    ok = [r for r in rows if "us" in r and r.get("out") != "alloc"]
    lines = [f"# Fused MoE decode kernels, tile sweep ({meta['gpu']}, torch {meta['torch']})", "",
             f"- command: `{meta['command']}`, {meta['date']}",
             f"- every call reads another of {meta['layers']} layer copies (random top-k plus the "
             f"shared expert as the last slot), timed in one CUDA graph of back-to-back calls; "
             f"copy bandwidth measured in the run: {meta['copy_gbps']:.0f} GB/s",
             "- bytes: the distinct experts of a call (weights, not scales); % of copy = their "
             "read rate over the copy bandwidth"]
    if any(r["kernel"] == "down_split" for r in ok):
        zero = ", ".join(f"{key} {us:.1f} µs" for key, us in meta.get("zero_us", {}).items())
        note = ("- down_split: `moe_down_combine_triton(..., slot_split=S, k_split=K, out=buf)`"
                ", S slot groups × K chunks of I a (row, block of H) atomically adding fp32 "
                "partial sums into `buf`, an fp32 [B, H] buffer per layer zeroed ONCE, outside "
                "the timed loop (the engine zeroes every layer's buffer in one launch a step: "
                f"zeroing {meta.get('zero_layers', '?')} layers' buffers, one memset replayed "
                f"from a CUDA graph, launch included, took {zero or '?'}; not in the times); "
                "fp32 output, no bf16 cast; its default row is the engine's default bf16 call "
                "(as `down`'s)")
        lines.append(note)
    lines += ["",
              "| shape | kernel | B | default µs | best tile (block, BK, warps) | µs | % of copy "
              "| × default |", "|---|---|---|---|---|---|---|---|"]
    for key in sorted({(r["shape"], r["kernel"], r["B"]) for r in ok}):
        mine = [r for r in ok if (r["shape"], r["kernel"], r["B"]) == key]
        best = min(mine, key=lambda r: r["us"])
        default = min((r for r in mine if r["default"]), key=lambda r: r["us"])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {default['us']:.1f} | "
                     f"{_tile(best)} | {best['us']:.1f} | "
                     f"{100 * best['copy_frac']:.0f} % | {default['us'] / best['us']:.2f} |")
    split = [r for r in rows if "us" in r and r["kernel"] == "down_split" and r.get("out")]
    if split:
        intro = ("Down + combine with a slot / K split, best tile per (S, K split). µs: `out` "
                 "given (zeroed once outside the loop); without out: the same tile allocating a "
                 "zeroed fp32 buffer and casting to bf16 every call; rel. err: the fp32 sums "
                 "against the default bf16 kernel's output (one layer, ~1e-3 is its bf16 "
                 "rounding; WRONG above 1e-2: a slot lost or counted twice).")
        head = ("| shape | B | S | K split | best tile (block, BK, warps) | µs | % of copy "
                "| × default | µs without out | rel. err |")
        lines += ["", intro, "", head, "|---|---|---|---|---|---|---|---|---|---|"]
        for key in sorted({(r["shape"], r["B"], r["kw"]["slot_split"], r["kw"]["k_split"])
                           for r in split}):
            mine = [r for r in split
                    if (r["shape"], r["B"], r["kw"]["slot_split"], r["kw"]["k_split"]) == key]
            given = [r for r in mine if r["out"] == "given"]
            if not given:
                continue
            best = min(given, key=lambda r: r["us"])
            alloc = next((r for r in mine if r["out"] == "alloc"), None)
            default = next((r for r in ok if (r["shape"], r["kernel"], r["B"]) ==
                            (key[0], "down_split", key[1]) and r["default"]), None)
            worst = max(r["rel_err"] for r in given)
            flag = " WRONG" if worst > 1e-2 else ""  # a slot lost or added: ~0.1 and more
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {_tile(best)} | "
                         f"{best['us']:.1f} | {100 * best['copy_frac']:.0f} % | "
                         f"{'-' if default is None else format(default['us'] / best['us'], '.2f')}"
                         f" | {'-' if alloc is None else format(alloc['us'], '.1f')} | "
                         f"{best['rel_err']:.0e} (worst tile {worst:.0e}){flag} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
