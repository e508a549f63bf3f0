"""What programmatic dependent launch (PDL) saves on a chain of decode GEMVs, CUDA only.

    python3 bench/pdl_chain_check.py [--calls 64] [--out FILE.json]

A decode step is ~250-600 back-to-back kernels; each one's launch, ramp-up and tail cost a
microsecond or two that PDL can overlap with its predecessor (`launch_pdl`, the kernel waiting
in `pdl_wait` before its first load, kernels/pdl.py). Per shape: µs per call of a CUDA graph
of `--calls` one-row GEMVs over rotating weight copies, launched as `engine_launch` launches
them (into an fp32 `out`), with and without PDL, and whether the two chains' sums agree.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.dequant_gemv import (  # noqa: E402
    engine_launch,
    quantize_fp8_row,
)
from ninfer_engine.kernels.dequant_gemv_kernels import dequant_gemv_triton  # noqa: E402
from ninfer_engine.kernels.pdl import set_pdl  # noqa: E402

# (N, K, weight form): 27B GDN out / down (fp8-row), 35B-A3B gdn_out (bf16), 27B gate|up (fp8)
SHAPES = {"27b.gdn_out.fp8": (5120, 6144, "fp8_row"), "27b.down.fp8": (5120, 17408, "fp8_row"),
          "a3b.gdn_out.bf16": (2048, 4096, "bf16"), "27b.gate_up.fp8": (34816, 5120, "fp8_row")}


def chain(name, calls) -> dict:
    n, k, form = SHAPES[name]
    w = (torch.randn(n, k, device="cuda") / 64).bfloat16()
    codes, scale = quantize_fp8_row(w) if form == "fp8_row" else (w, None)
    copies = max(calls, (512 << 20) // codes.nbytes + 1)
    ws = [(codes.clone(), None if scale is None else scale.clone()) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda").bfloat16()
    out = torch.zeros(1, n, device="cuda")
    launch = engine_launch(1, n, k, codes, scale, accumulate=True)
    row = {"shape": name, "N": n, "K": k, "form": form, "launch": launch}
    sums = {}
    for pdl in (False, True):
        set_pdl(pdl)
        graph = graph_of(lambda: [dequant_gemv_triton(x, c, s, out=out, **launch)
                                  for c, s in ws[:calls]])
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        sums[pdl] = out.clone()
        row["pdl_us" if pdl else "no_pdl_us"] = round(time_ms(graph.replay, 10) * 1e3 / calls, 2)
    set_pdl(True)
    row["sums_agree"] = torch.allclose(sums[True], sums[False], rtol=1e-4, atol=1e-3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name in SHAPES:
        rows.append(chain(name, args.calls))
        print(rows[-1], flush=True)
    print("\n| shape | [N, K] | form | no PDL µs | PDL µs | saved µs | sums agree |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | [{r['N']}, {r['K']}] | {r['form']} | {r['no_pdl_us']} | "
              f"{r['pdl_us']} | {r['no_pdl_us'] - r['pdl_us']:.2f} | {r['sums_agree']} |")
    if args.out:
        meta = {"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": triton.__version__, "python": platform.python_version(),
                "command": " ".join(sys.argv),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
