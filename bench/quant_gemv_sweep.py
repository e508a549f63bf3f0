"""Launch-configuration sweep of the packed-weight GEMV kernels (kernels/quant_gemv.py), CUDA only.

    python3 bench/quant_gemv_sweep.py --out bench/results/h200-quant-gemv.json [--full]

For q4/q5/q6/q8/nvfp4 on the 27B decode shapes (MLP up [17408,5120], down [5120,17408], fused
attention [10240,5120]) at B = 1 and 8: both variants (`dot`) over block sizes, each timed in a
CUDA graph of back-to-back calls that rotate over enough weight copies to defeat the 50 MB L2.
Reports GB/s of weight bytes read, the fraction of 4.8 TB/s, the speed-up over cuBLAS bf16
`F.linear` on the same shape, the relative error against the torch reference, and the dequant
kernel (prefill path) bandwidth. Prints a table and writes every row to `--out` as JSON.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import graph_of, time_ms  # noqa: E402
from ninfer_engine.codecs import planes as stored  # noqa: E402
from ninfer_engine.kernels import quant_gemv as qg  # noqa: E402

FORMATS = {"q4": ("q4_g64_fp16", 4, 64), "q5": ("q5_g64_fp16", 5, 64),
           "q6": ("q6_g64_fp16", 6, 64), "q8": ("q8_g32_fp16", 8, 32), "nvfp4": None}
SHAPES = {"mlp_up": (17408, 5120), "mlp_down": (5120, 17408), "attn_fused": (10240, 5120)}
HBM_GBPS = 4800.0
L2_DEFEAT_BYTES = 256 << 20
CALLS_PER_GRAPH = 20
print = functools.partial(print, flush=True)  # noqa: A001 (progress survives a timeout)
DEVICE = "cuda"


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _time_rotating(fns):
    """µs per call of `fns` called round-robin, CALLS_PER_GRAPH calls per graph replay."""
    def body():
        for i in range(CALLS_PER_GRAPH):
            fns[i % len(fns)]()
    graph = graph_of(body)
    return time_ms(graph.replay, 10) / CALLS_PER_GRAPH * 1e3


def _planes(fmt, n, k):
    w = torch.randn(n, k, device=DEVICE) * 0.02
    if fmt == "nvfp4":
        codes, scale, d_w = stored.quantize_nvfp4(w)
        planes, ref = (codes, scale, d_w), qg.nvfp4_dequant_ref(codes, scale, d_w)
    else:
        name, bits, group = FORMATS[fmt]
        base, high, scale = stored.quantize_rowsplit(w, name)
        planes = (base, high, scale, bits, group, k)
        ref = qg.rowsplit_dequant_ref(base, high, scale, bits, group, k)
    nbytes = sum(p.numel() * p.element_size() for p in planes if torch.is_tensor(p))
    return planes, ref, nbytes


def _copies(planes, nbytes):
    count = max(2, -(-L2_DEFEAT_BYTES // nbytes))
    return [tuple(p.clone() if torch.is_tensor(p) else p for p in planes) for _ in range(count)]


def _write(path, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    meta = dict(device=device, torch=torch.__version__, triton=triton.__version__,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(["python3", "bench/quant_gemv_sweep.py", *sys.argv[1:]]))
    Path(path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--full", action="store_true", help="also 8 warps and 2/4 stages")
    args = ap.parse_args()
    assert DEVICE != "cuda" or torch.cuda.is_available(), "the sweep needs CUDA"
    grid = list(itertools.product((False, True), (16, 32, 64, 128), (8, 16, 32),
                                  (4, 8) if args.full else (4,), (2, 3, 4) if args.full else (3,)))
    rows = []
    print(f"{'fmt':6}{'shape':12}{'B':>3} {'variant':34}{'µs':>9}{'GB/s':>9}{'%HBM':>6}"
          f"{'x cuBLAS':>9}{'rel.err':>9}")
    for fmt, shape_name in itertools.product(args.formats.split(","), args.shapes.split(",")):
        n, k = SHAPES[shape_name]
        torch.manual_seed(0)
        planes, w_ref, nbytes = _planes(fmt, n, k)  # w_ref: fp32
        copies = _copies(planes, nbytes)
        gemv = qg.nvfp4_gemv_triton if fmt == "nvfp4" else qg.rowsplit_gemv_triton
        dequant = qg.nvfp4_dequant if fmt == "nvfp4" else qg.rowsplit_dequant
        us = _time_rotating([lambda c=c: dequant(*c, kernel=True) for c in copies])
        moved = nbytes + n * k * 2
        print(f"{fmt:6}{shape_name:12}{'-':>3} {'dequant→bf16 (prefill)':34}{us:9.1f}"
              f"{moved / us / 1e3:9.0f}{moved / us / 1e3 / HBM_GBPS * 100:6.0f}")
        rows.append(dict(fmt=fmt, shape=[n, k], kind="dequant", us=us,
                         gbps=moved / us / 1e3))
        dense = [w_ref.bfloat16() for _ in range(max(2, -(-L2_DEFEAT_BYTES // (n * k * 2))))]
        for B in map(int, args.batches.split(",")):
            x = torch.randn(B, k, device=DEVICE, dtype=torch.bfloat16)
            ref = x.float() @ w_ref.t()
            cublas = _time_rotating([lambda d=d: F.linear(x, d) for d in dense])
            print(f"{fmt:6}{shape_name:12}{B:3d} {'cuBLAS bf16 F.linear':34}{cublas:9.1f}"
                  f"{n * k * 2 / cublas / 1e3:9.0f}")
            rows.append(dict(fmt=fmt, shape=[n, k], B=B, kind="cublas_bf16", us=cublas))
            for dot, bn, bkw, warps, stages in grid:
                kw = dict(dot=dot, block_n=bn, block_kw=bkw, num_warps=warps, num_stages=stages)
                name = f"dot={dot:d} BN={bn} BKW={bkw} w={warps} s={stages}"
                try:
                    err = _rel(gemv(x, *planes, **kw), ref)
                    us = _time_rotating([lambda c=c: gemv(x, *c, **kw) for c in copies])
                except Exception as exc:  # noqa: BLE001 (a config that does not compile)
                    print(f"{fmt:6}{shape_name:12}{B:3d} {name:34} failed: {exc!r:.80}")
                    continue
                gbps = nbytes / us / 1e3
                print(f"{fmt:6}{shape_name:12}{B:3d} {name:34}{us:9.1f}{gbps:9.0f}"
                      f"{gbps / HBM_GBPS * 100:6.0f}{cublas / us:9.2f}{err:9.1e}"
                      + ("  WRONG" if err > 1e-2 else ""))
                rows.append(dict(fmt=fmt, shape=[n, k], B=B, kind="gemv", **kw, us=us,
                                 gbps=gbps, hbm_frac=gbps / HBM_GBPS, vs_cublas=cublas / us,
                                 rel_err=err))
        del planes, copies, dense, w_ref
        torch.cuda.empty_cache()
        _write(args.out, rows)  # after every shape: partial results survive a timeout
    best = {}
    for r in rows:
        if r["kind"] == "gemv":
            key = (r["fmt"], tuple(r["shape"]), r["B"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    print("\nbest per (format, shape, B):")
    for (fmt, shape, B), r in sorted(best.items()):
        print(f"  {fmt:6}{str(list(shape)):14}B={B}: {r['us']:.1f} µs {r['gbps']:.0f} GB/s "
              f"({r['hbm_frac'] * 100:.0f}% HBM) x{r['vs_cublas']:.2f} vs cuBLAS  dot={r['dot']:d} "
              f"BN={r['block_n']} BKW={r['block_kw']} w={r['num_warps']} s={r['num_stages']}")


if __name__ == "__main__":
    main()
