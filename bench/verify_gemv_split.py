"""A verify row's GEMVs of several rows without an fp32 `out`: whole K or K split, CUDA only.

    python3 bench/verify_gemv_split.py [--rows 4,8] [--shapes gdn_in,attn_in,router] [--fp8]
                                       [--out F]

At several rows the dequant GEMV took its dot path with 64-row programs, and `split_k` split K
so that about two waves cover the SMs; without an fp32 `out` to add into, a split writes fp32
partial sums that a torch `sum(0)` and a cast reduce: two more launches. On the 35B-A3B's
fp8-row verify step those were 40 reduce and 40 cast kernels a step, from the GDN and attention
in-projections (N = 12,352 and 9,216 at K = 2,048; bench/results/h100-verify-gemv-split.md).
This times, per shape and row count, in a CUDA graph of back-to-back calls over weight copies
past the L2: the engine's call (`dequant_gemv`), programs of 16, 32 and 64 rows with K whole
or split (the reduction included, as the engine pays it; `atomic`: into a zeroed fp32 buffer),
and for bf16 weights cuBLAS (`F.linear`); each output checked against the first's. `--fp8`:
the fp8-row recipe's weights (e4m3 codes, a bf16 scale a row).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import copy_bandwidth_gbps, graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.dequant_gemv import dequant_gemv  # noqa: E402
from ninfer_engine.kernels.dequant_gemv_kernels import dequant_gemv_triton  # noqa: E402

# 35B-A3B: GDN q|k|v|z|b|a, attention q|gate|k|v, both from H = 2048; the MoE's router|shared
# score (256 + 1 outputs), the one several-row plain GEMV the step runs through this kernel
SHAPES = {"gdn_in": (12352, 2048), "attn_in": (9216, 2048), "router": (257, 2048)}
SPLITS = {"router": (1, 2, 4, 8)}  # few programs: the engine's call splits K 8 ways
OVER_L2 = 100 * 2**20  # each shape's weight copies add up past the 50 MB L2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="4,8")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--fp8", action="store_true",
                    help="fp8-row weights (e4m3 codes, a bf16 scale a row), as the fp8-row recipe")
    ap.add_argument("--out")
    args = ap.parse_args()
    gbps, rows = copy_bandwidth_gbps(), []
    for name in args.shapes.split(","):
        N, K = SHAPES[name]
        width = 1 if args.fp8 else 2  # bytes a weight
        copies = max(8, -(-OVER_L2 // (N * K * width)))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
              for _ in range(copies)]
        if args.fp8:  # (codes, row scale) pairs
            ws = [(w.to(torch.float8_e4m3fn), torch.rand(N, device="cuda").to(torch.bfloat16))
                  for w in ws]
        for B in (int(b) for b in args.rows.split(",")):
            x = torch.randn(B, K, device="cuda", dtype=torch.bfloat16)

            def operands(w):  # (weight, scale) as dequant_gemv takes them
                return (w, None) if not args.fp8 else w
            variants = {"engine": lambda w: dequant_gemv(x, *operands(w))}
            if not args.fp8:  # cuBLAS has no fp8-row GEMV to compare
                variants["cublas"] = lambda w: F.linear(x, w)
            for bn in (16, 32, 64):
                for split in SPLITS.get(name, (1, 2)):
                    variants[f"bn{bn} split{split}"] = (
                        lambda w, bn=bn, split=split: dequant_gemv_triton(
                            x, *operands(w), block_n=bn, split=split))
                    if split > 1:  # atomics into a zeroed fp32 buffer, then the cast
                        variants[f"bn{bn} split{split} atomic"] = (
                            lambda w, bn=bn, split=split: dequant_gemv_triton(
                                x, *operands(w), block_n=bn, split=split, atomic=True))
            ref = None
            for label, call in variants.items():
                out = call(ws[0]).float()
                ref = out if ref is None else ref
                err = ((out - ref).norm() / ref.norm()).item()
                graph = graph_of(lambda call=call: [call(w) for w in ws])
                us = time_ms(graph.replay, 20) * 1e3 / copies
                row = dict(shape=name, N=N, K=K, B=B, fp8=args.fp8, variant=label, us=round(us, 2),
                           tbps=round(N * K * width / us / 1e6, 3), rel_err=err)
                rows.append(row)
                print(f"{name} B={B} {label:16s} {us:7.2f} µs  {row['tbps']:.2f} TB/s  "
                      f"err {err:.1e}", flush=True)
    if args.out:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    copy_gbps=gbps, date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    command=" ".join(["python3", "bench/verify_gemv_split.py", *sys.argv[1:]]))
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
