"""What the decode GEMV's fusions cost or save (kernels/dequant_gemv.py `gate`/`act`, `out`),
on the 27B's down [5120, 17408] and o [5120, 6144] projections, CUDA only.

    python3 bench/gemv_fusion_check.py [--batches 1,2,8] [--out FILE.json]

Per (shape, weight form, B): µs per call of the unfused sequence the step ran before (SiLU or
sigmoid and the product as torch ops, then the GEMV returning bf16) against the GEMV with the
gated input, with the fp32 accumulation, and with both; each timed as a CUDA graph of calls
rotating over weight copies larger than the L2 (bench/fp8_gemv_sweep.py's method).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.dequant_gemv import (dequant_gemv, gated_ref,  # noqa: E402
                                                quantize_fp8_groups, quantize_fp8_row)

SHAPES = {"down": ((5120, 17408), "silu"), "o": ((5120, 6144), "sigmoid")}


def forms(w):
    yield "bf16", (w, None)
    yield "fp8_row", quantize_fp8_row(w)
    yield "fp8_g64", quantize_fp8_groups(w, 64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,8")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name, ((n, k), act) in SHAPES.items():
        base = torch.randn(n, k, device="cuda") / 64
        for form, (codes, scale) in forms(base.bfloat16()):
            copies = max(2, (256 << 20) // (codes.nbytes + 1))
            ws = [(codes.clone(), None if scale is None else scale.clone()) for _ in range(copies)]
            for B in map(int, args.batches.split(",")):
                if form == "bf16" and B != 1:
                    continue  # several bf16 rows take cuBLAS, not this kernel
                gu = torch.randn(B, 2 * k, device="cuda").bfloat16()
                g, x = gu[:, :k], gu[:, k:]
                acc = torch.zeros(B, n, device="cuda")
                calls = {
                    "unfused": lambda c, s: dequant_gemv(gated_ref(x, g, act), c, s),
                    "gate": lambda c, s: dequant_gemv(x, c, s, gate=g, act=act),
                    "out": lambda c, s: dequant_gemv(x.contiguous(), c, s, out=acc),
                    "gate+out": lambda c, s: dequant_gemv(x, c, s, gate=g, act=act, out=acc),
                    "plain": lambda c, s: dequant_gemv(x.contiguous(), c, s),
                }
                row = dict(shape=name, N=n, K=k, form=form, B=B)
                for label, fn in calls.items():
                    graph = graph_of(lambda fn=fn: [fn(c, s) for c, s in ws])
                    row[label] = round(time_ms(graph.replay, 5) * 1e3 / copies, 2)
                rows.append(row)
                print(row, flush=True)
    cols = ["plain", "unfused", "gate", "out", "gate+out"]
    print("\n| shape | form | B | " + " | ".join(f"{c} µs" for c in cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for r in rows:
        print(f"| {r['shape']} | {r['form']} | {r['B']} | "
              + " | ".join(str(r[c]) for c in cols) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
