"""The 4-bit nibble GEMV (kernels/nibble_gemv.py) against the fp8-group form the engine serves
Q4 in today, at the 27B's Q4 shapes, one row, CUDA only.

    python3 bench/nibble_gemv_sweep.py [--budget S] [--out FILE.json]

Per shape: µs per call of the fp8-group GEMV as `engine_launch` launches it, and of the nibble
kernel over block_n × words per iteration × K split × pairs, each as a CUDA graph of calls
rotating over weight copies larger than the L2; % of copy = bytes read (codes + scales) over
the measured copy bandwidth; worst relative error against the torch reference of each form.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import copy_bandwidth_gbps, graph_of, time_ms  # noqa: E402
from ninfer_engine.kernels.dequant_gemv import dequant_gemv_ref, dequant_gemv_triton, engine_launch  # noqa: E402
from ninfer_engine.kernels.nibble_gemv import nibble_gemv_ref, nibble_gemv_triton, pack_nibble_words  # noqa: E402

# the 27B recipe's Q4 matrices (qwen3_6_27b): MLP gate|up, GDN q|k, attention q|k
SHAPES = {"gate_up": (34816, 5120), "gdn_qk": (4096, 5120), "attn_qk": (7168, 5120),
          "down_as_q4": (5120, 17408)}


def rotating(tensors, copies_bytes=256 << 20):
    size = sum(t.nbytes for t in tensors)
    return [tuple(t.clone() for t in tensors) for _ in range(max(2, copies_bytes // size + 1))]


def timed(fn_of, sets) -> float:
    graph = graph_of(lambda: [fn_of(*s) for s in sets])
    return time_ms(graph.replay, 5) * 1e3 / len(sets)


def nibble_row(name, n, k, x, words, scale, kw, sets, want, bw) -> dict:
    got = nibble_gemv_triton(x, words, scale, **kw).float()
    err = ((got - want).abs().max() / want.abs().max()).item()
    us = timed(lambda w, s: nibble_gemv_triton(x, w, s, **kw), sets)
    nbytes = words.nbytes + scale.nbytes
    return dict(shape=name, N=n, K=k, form="nibble", launch=kw, us=round(us, 2),
                pct_copy=round(100 * nbytes / us / 1e3 / bw, 1), rel_err=err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the sweep")
    ap.add_argument("--out")
    args = ap.parse_args()
    t_end = time.monotonic() + args.budget
    bw = copy_bandwidth_gbps()
    rows = []
    for name, (n, k) in SHAPES.items():
        codes = torch.randint(-8, 8, (n, k), device="cuda", dtype=torch.int8)
        scale = (torch.rand(n, k // 64, device="cuda") * 0.02 + 1e-3).half()
        x = torch.randn(1, k, device="cuda").bfloat16()
        fp8 = codes.to(torch.float8_e4m3fn)
        words = pack_nibble_words(codes)
        want = dequant_gemv_ref(x, fp8, scale).float()
        launch = engine_launch(1, n, k, fp8, scale)
        err = ((dequant_gemv_triton(x, fp8, scale, **launch).float() - want).abs().max()
               / want.abs().max()).item()
        us = timed(lambda c, s, x=x, launch=launch: dequant_gemv_triton(x, c, s, **launch),
                   rotating((fp8, scale)))
        nbytes = fp8.nbytes + scale.nbytes
        rows.append(dict(shape=name, N=n, K=k, form="fp8_g64 (engine)", launch=launch,
                         us=round(us, 2), pct_copy=round(100 * nbytes / us / 1e3 / bw, 1),
                         rel_err=err))
        print(rows[-1], flush=True)
        sets = rotating((words, scale))
        want = nibble_gemv_ref(x, words, scale).float()
        for pairs in (True, False):
            for num_warps in (4, 8):
                for block_n in (32, 64, 128):
                    for block_g in (2, 4, 8):
                        blocks = triton.cdiv(n, block_n)
                        for split in (1, 2, 4, 8):
                            if time.monotonic() > t_end:
                                break
                            if k % (block_g * 64 * split) or (split > 1
                                                              and blocks * split > 4 * 132):
                                continue
                            kw = dict(block_n=block_n, block_g=block_g, split=split,
                                      pairs=pairs, num_warps=num_warps)
                            rows.append(nibble_row(name, n, k, x, words, scale, kw, sets,
                                                   want, bw))
                            print(rows[-1], flush=True)
    print("\n| shape | [N, K] | fp8_g64 engine µs | % copy | best nibble launch | µs | % copy "
          "| speed-up | nibble rel. err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in SHAPES:
        base = [r for r in rows if r["shape"] == name and r["form"] != "nibble"]
        nib = [r for r in rows if r["shape"] == name and r["form"] == "nibble"]
        if not base or not nib:
            continue
        b, best = base[0], min(nib, key=lambda r: r["us"])
        print(f"| {name} | [{b['N']}, {b['K']}] | {b['us']} | {b['pct_copy']} | "
              f"{best['launch']} | {best['us']} | {best['pct_copy']} | "
              f"{b['us'] / best['us']:.2f} | {max(r['rel_err'] for r in nib):.1e} |")
    if args.out:
        meta = dict(machine=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__, python=platform.python_version(),
                    copy_gbps=round(bw), command=" ".join(sys.argv),
                    date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
