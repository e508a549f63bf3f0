"""The Gated DeltaNet decode/verify kernels' variants at the real shapes, one GDN layer stack
captured in one CUDA graph.

    python3 bench/gdn_decode_sweep.py [--out F.json] [--budget-s 120]
    python3 bench/gdn_decode_sweep.py --smoke   # tiny shapes on the CPU interpreter (plumbing)

Per shape (27B: nk 16, nv 48, 48 GDN layers; 35B-A3B: nk 16, nv 32, 30 GDN layers; dk = dv =
128) and row kind (B = 1 verify of 1 + 3 tokens with its trail, B = 1 decode, B = 8 decode, a
64-token prompt row as the prompt step walks it: padded-row counts, no trail),
each over slot-indexed fp32 states as the step runs them: the µs of one layer's
`gdn_decode_triton` (the graph of every layer's launch replayed, divided by the layers) for
each (block_v, num_warps), the launch default (`gdn_decode.launch_tiles`) among them; each
variant's output checked against the reference first. (Until 12-07 the grid also had the update
as the rule is written against the one-pass form, now the only one:
bench/results/h100-gdn-decode-tiles.md.) The state's bytes (read and written, with the
trail's) over the copy bandwidth give the floor.
(The conv prep kernel's window in registers against the loop through memory, timed by this
script's first part until both were measured: bench/results/h100-gdn-prep-window.md.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:  # before triton.jit runs: it picks the interpreter at decoration
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from ninfer_engine.benchmark.timing import copy_bandwidth_gbps, graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.gdn_decode import (  # noqa: E402
    gdn_decode_ref, gdn_decode_triton, launch_tiles)

# (name, nk, nv, dk, dv, GDN layers)
SHAPES = [("35B-A3B", 16, 32, 128, 128, 30), ("27B", 16, 48, 128, 128, 48)]
# (name, B, T): a 64-token prompt row (the prompt step's walk, padded-row counts, no trail)
ROWS = [("verify 1+3 B=1", 1, 4), ("decode B=1", 1, 1), ("decode B=8", 8, 1),
        ("prompt row 64 B=1", 1, 64)]
VARIANTS = dict(block_v=[8, 16, 32, 64], num_warps=[1, 2, 4])
SMOKE_SHAPES = [("tiny", 2, 4, 16, 32, 2)]
SMOKE_VARIANTS = dict(block_v=[16, 32], num_warps=[1])


def layer_inputs(B, T, nk, nv, dk, dv, dev, seed):
    """One layer's inputs: q, k, v, g, beta for B rows of T tokens, the state pool (B + 2
    slots, rows in slots 2..), the index, the trail (a verify row's, 1 < T ≤ 4), the real
    tokens a row (a prompt row's, T > 4)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B * T, nk, dk, generator=gen).bfloat16()
    k = torch.randn(B * T, nk, dk, generator=gen).bfloat16()
    v = torch.randn(B * T, nv, dv, generator=gen).bfloat16()
    g = -torch.rand(B * T, nv, generator=gen) * torch.logspace(-2, 0.5, nv)
    beta = torch.rand(B * T, nv, generator=gen)
    state = torch.randn(B + 2, nv, dk, dv, generator=gen) * 0.1
    index = torch.arange(2, B + 2)
    trail = torch.zeros(T - 1, B, nv, dk, dv) if 1 < T <= 4 else None
    valid = torch.full((B,), T, dtype=torch.int32) if T > 4 else None
    return [None if t is None else t.to(dev)
            for t in (q, k, v, g, beta, state, index, trail, valid)]


def checked(layer, variant) -> float:
    """The variant's relative error against the reference on one layer (output and state)."""
    q, k, v, g, beta, state, index, trail, valid = layer
    s_ref, s_tri = state.cpu().clone(), state.clone()  # the reference updates s_ref in place
    o_ref = gdn_decode_ref(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), s_ref, index.cpu(),
                           valid=None if valid is None else valid.cpu())
    o = gdn_decode_triton(q, k, v, g, beta, s_tri, index,
                          None if trail is None else trail.clone(), valid=valid, **variant)
    err = lambda a, b: float((a.double().cpu() - b.double()).norm() / b.double().norm())
    return max(err(o, o_ref), err(s_tri[index].cpu(), s_ref[index.cpu()]))


def layer_us(layers, variant, reps: int) -> float:
    """µs a layer: every layer's launch captured in one CUDA graph (`timing.graph_of`),
    replayed `reps` times, the best of three (on the CPU: one call, timed)."""
    run = lambda: [gdn_decode_triton(q, k, v, g, beta, s, i, t, valid=n, **variant)
                   for q, k, v, g, beta, s, i, t, n in layers]
    if not torch.cuda.is_available():
        start = time.perf_counter()
        run()
        return 1e6 * (time.perf_counter() - start) / len(layers)
    graph = graph_of(run)
    return 1e3 * min(time_ms(graph.replay, reps) for _ in range(3)) / len(layers)


def summary(rows: list[dict], shapes) -> None:
    """A line per (shape, rows): the launch default's µs (`launch_tiles`) and the best's."""
    heads = {name: (nv, dv) for name, _, nv, _, dv, _ in shapes}
    for key in dict.fromkeys((r["shape"], r["rows"]) for r in rows):
        of = [r for r in rows if (r["shape"], r["rows"]) == key]
        block_v, warps = launch_tiles(of[0]["B"], *heads[key[0]])
        default = next((r["us_per_layer"] for r in of if r["block_v"] == block_v
                        and r["num_warps"] == warps), float("nan"))
        best = min(of, key=lambda r: r["us_per_layer"])
        print(f"summary {key[0]} {key[1]}: default ({block_v}, {warps} warps) {default:.2f} us, "
              f"best {best['us_per_layer']:.2f} us (block_v {best['block_v']}, warps "
              f"{best['num_warps']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    grid = SMOKE_VARIANTS if args.smoke else VARIANTS
    bandwidth = None
    if dev == "cuda":
        bandwidth = copy_bandwidth_gbps()
    began = time.monotonic()
    rows = []
    print(f"{'shape':8} {'rows':16} {'block_v':>7} {'warps':>5} "
          f"{'us/layer':>9} {'floor us':>8} {'rel err':>9}")
    for (name, nk, nv, dk, dv, depth), (kind, B, T) in itertools.product(shapes, ROWS):
        layers = [layer_inputs(B, T, nk, nv, dk, dv, dev, seed) for seed in range(depth)]
        # the state read and written, the trail (a verify row's) written: fp32
        nbytes = 4 * B * nv * dk * dv * (2 + (T - 1 if 1 < T <= 4 else 0))
        floor = None if bandwidth is None else 1e6 * nbytes / (bandwidth * 1e9)
        for values in itertools.product(*grid.values()):
            if time.monotonic() - began > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: stopped")
                break
            variant = dict(zip(grid, values))
            err = checked(layers[0], variant)
            us = layer_us(layers, variant, reps=1 if args.smoke else 50)
            rows.append(dict(shape=name, rows=kind, B=B, T=T, **variant, us_per_layer=us,
                             floor_us=floor, rel_err=err))
            print(f"{name:8} {kind:16} {variant['block_v']:>7} "
                  f"{variant['num_warps']:>5} {us:9.2f} "
                  f"{'' if floor is None else f'{floor:8.2f}'} {err:9.2e}", flush=True)
    summary(rows, shapes)
    if args.out:
        meta = dict(machine=torch.cuda.get_device_name() if dev == "cuda" else platform.processor(),
                    torch=torch.__version__, copy_bandwidth_gbps=bandwidth,
                    date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    command=" ".join(sys.argv))
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
