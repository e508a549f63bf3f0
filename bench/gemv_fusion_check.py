"""What the decode GEMV's fusions cost or save (kernels/dequant_gemv.py `gate`/`act`, `out`),
on the 27B's down [5120, 17408] and o [5120, 6144] projections, CUDA only.

    python3 bench/gemv_fusion_check.py [--batches 1,2,8] [--out FILE.json]
    python3 bench/gemv_fusion_check.py --splits [--out FILE.json]

Per (shape, weight form, B), µs per call (`CALLS`): the GEMV of a ready input (plain); the
gate as two torch ops (unfused, the step before) or one Triton launch (kernel) before it, or
read by the GEMV itself (gate); each with the fp32 accumulation into a buffer (out) instead
of a bf16 product; launched as `engine_launch` does, timed as a CUDA graph of calls rotating
over weight copies larger than the L2 (bench/fp8_gemv_sweep.py's method), plus the worst
relative error of the variants' products against the torch reference.

`--splits`: one row into an fp32 `out` (where a K split costs no zero fill or cast), on the
projections that add into the residual or feed the router, bf16 (35B-A3B and 27B shapes) and
the 27B's fp8 forms, over block_n × K per iteration × K split, beside the engine's launch
(`engine_launch(..., accumulate=True)`): which launch it should take when `out` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.dequant_gemv import (  # noqa: E402
    dequant_gemv_ref, engine_launch, gated_ref, quantize_fp8_groups, quantize_fp8_row)
from ninfer_engine.kernels.dequant_gemv_kernels import (  # noqa: E402
    dequant_gemv_triton, gated_triton)

SHAPES = {"down": ((5120, 17408), "silu"), "o": ((5120, 6144), "sigmoid")}
SPLIT_SHAPES = {"a3b.gdn_out": (2048, 4096), "a3b.router": (257, 2048),
                "27b.gdn_out": (5120, 6144), "27b.down": (5120, 17408)}
# the fp8 forms serve the 27B (fp8-row, Q4/Q5 as fp8 groups of 64): its residual projections
SPLIT_FORMS = {"bf16": SPLIT_SHAPES, "fp8_row": ("27b.gdn_out", "27b.down"),
               "fp8_g64": ("27b.gdn_out", "27b.down")}


def rotating(w, copies_bytes=256 << 20):
    return [w.clone() for _ in range(max(2, copies_bytes // w.nbytes + 1))]


def split_grid(form):
    """(block_n, K per iteration keyword, its values) swept for `form`."""
    if form == "bf16":
        return (16, 32), "block_k", (256, 512)
    return (32, 64, 128), "block_k" if form == "fp8_row" else "group_k", (256, 512)


def splits() -> list[dict]:
    rows = []
    for form, names in SPLIT_FORMS.items():
        for name in names:
            n, k = SPLIT_SHAPES[name]
            w = (torch.randn(n, k, device="cuda") / 64).bfloat16()
            codes, scale = ENCODE[form](w)
            ws = [(c, None if scale is None else scale.clone()) for c in rotating(codes)]
            x = torch.randn(1, k, device="cuda").bfloat16()
            acc = torch.zeros(1, n, device="cuda")
            block_ns, kkey, kvals = split_grid(form)
            grid = [None] + [dict(block_n=bn, fma=True, split=sp, **{kkey: kv})
                             for bn in block_ns for kv in kvals for sp in (1, 2, 4, 8)
                             if (k // kv) % sp == 0]
            for kw in grid:  # None: the engine's launch (`engine_launch`, accumulate=True)
                launch = kw or engine_launch(1, n, k, codes, scale, accumulate=True)
                graph = graph_of(lambda launch=launch: [
                    dequant_gemv_triton(x, c, sc, out=acc, **launch) for c, sc in ws])
                us = time_ms(graph.replay, 5) * 1e3 / len(ws)
                rows.append(dict(shape=name, form=form, N=n, K=k, engine=kw is None,
                                 launch=launch, us=round(us, 2)))
                print(rows[-1], flush=True)
    print("\n| shape | form | [N, K] | best launch | µs | engine's launch | µs |")
    print("|---|---|---|---|---|---|---|")
    for key in dict.fromkeys((r["shape"], r["form"]) for r in rows):
        mine = [r for r in rows if (r["shape"], r["form"]) == key]
        best = min(mine, key=lambda r: r["us"])
        eng = next(r for r in mine if r["engine"])
        show = lambda d: ", ".join(f"{a}={b}" for a, b in d.items() if a != "fma")  # noqa: E731
        print(f"| {key[0]} | {key[1]} | [{best['N']}, {best['K']}] | {show(best['launch'])} | "
              f"{best['us']} | {show(eng['launch'])} | {eng['us']} |")
    return rows


ENCODE = {"bf16": lambda w: (w, None), "fp8_row": quantize_fp8_row,
          "fp8_g64": lambda w: quantize_fp8_groups(w, 64)}  # (codes, scale) of a bf16 weight


def forms(w):
    for form, encode in ENCODE.items():
        yield form, encode(w)


CALLS = ("plain", "unfused", "kernel", "gate", "out", "kernel+out", "gate+out")


def fusion_row(name, form, B, n, k, act, ws) -> dict:
    """µs of each way to run the projection of `x · act(gate)` (the module docstring; `kernel`:
    the gate as one Triton elementwise launch, `gated_triton`), launched as `engine_launch`
    does, and the worst relative error of their products against the torch reference."""
    gu = torch.randn(B, 2 * k, device="cuda").bfloat16()
    g, x = gu[:, :k], gu[:, k:]
    xc = x.contiguous()
    acc = torch.zeros(B, n, device="cuda")

    def run(c, s, gate=None, out=None, xin=None):
        launch = engine_launch(B, n, k, c, s, accumulate=out is not None)
        xin = x if gate is not None else xin
        return dequant_gemv_triton(xin, c, s, gate=gate, act=act, out=out, **launch)

    calls = {
        "plain": lambda c, s: run(c, s, xin=xc),
        "unfused": lambda c, s: run(c, s, xin=gated_ref(x, g, act)),
        "kernel": lambda c, s: run(c, s, xin=gated_triton(x, g, act)),
        "gate": lambda c, s: run(c, s, gate=g),
        "out": lambda c, s: run(c, s, out=acc, xin=xc),
        "kernel+out": lambda c, s: run(c, s, out=acc, xin=gated_triton(x, g, act)),
        "gate+out": lambda c, s: run(c, s, gate=g, out=acc),
    }
    if B != 1:  # the gate reads into the fma (one-row) variant only
        del calls["gate"], calls["gate+out"]
    c0, s0 = ws[0]
    gated_want = dequant_gemv_ref(gated_ref(x, g, act), c0, s0).float()
    plain_want = dequant_gemv_ref(xc, c0, s0).float()  # "plain" and "out" take x ungated
    row, worst = dict(shape=name, N=n, K=k, form=form, B=B), 0.0
    for label, fn in calls.items():
        acc.zero_()
        got = fn(c0, s0).float()
        want = plain_want if label in ("plain", "out") else gated_want
        worst = max(worst, ((got - want).norm() / want.norm()).item())
        graph = graph_of(lambda fn=fn: [fn(c, s) for c, s in ws])
        row[label] = round(time_ms(graph.replay, 5) * 1e3 / len(ws), 2)
    row["rel_err"] = worst
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,8")
    ap.add_argument("--out")
    ap.add_argument("--splits", action="store_true")
    args = ap.parse_args()
    if args.splits:
        rows = splits()
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return
    rows = []
    for name, ((n, k), act) in SHAPES.items():
        base = torch.randn(n, k, device="cuda") / 64
        for form, (codes, scale) in forms(base.bfloat16()):
            copies = max(2, (256 << 20) // (codes.nbytes + 1))
            ws = [(codes.clone(), None if scale is None else scale.clone()) for _ in range(copies)]
            for B in map(int, args.batches.split(",")):
                if form == "bf16" and B != 1:
                    continue  # several bf16 rows take cuBLAS, not this kernel
                rows.append(fusion_row(name, form, B, n, k, act, ws))
                print(rows[-1], flush=True)
    print("\n| shape | form | B | " + " | ".join(f"{c} µs" for c in CALLS)
          + " | worst rel. err |")
    print("|---|---|---|" + "---|" * (len(CALLS) + 1))
    for r in rows:
        print(f"| {r['shape']} | {r['form']} | {r['B']} | "
              + " | ".join(str(r.get(c, "—")) for c in CALLS) + f" | {r['rel_err']:.1e} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
