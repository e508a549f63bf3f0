"""The Gated DeltaNet prefill core: torch `chunked_gated_delta` vs the Triton `chunk_gated_delta`.

    python3 bench/gdn_chunk_bench.py [--out bench/results/h200-gdn-chunk.json] [--sweep]
    python3 bench/gdn_chunk_bench.py --smoke   # tiny shapes on the CPU interpreter (plumbing)

Per shape (27B: nk 16, nv 48, 48 GDN layers; 35B-A3B: nk 16, nv 32, 30 GDN layers; dk = dv = 128)
and prompt length T: the mean ms (CUDA events, `benchmark.timing.time_ms`) of one layer's GDN
core in torch, of the Triton path with IEEE fp32 dots and with TF32 dots, and of the precompute
alone, torch (`models.gdn.chunk_prep`, on expanded q / k) and Triton (`kernels.gdn_prep`, TF32,
reading q / k per key head); the error of each Triton output / state against the torch reference
(‖·‖ relative, and max |Δ| / max |ref|); the whole layer stack's ms and tokens/s of this core.
`--sweep` also times the kernel's (block_v, num_warps, num_stages) variants at the largest T.
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
import triton  # noqa: E402

from ninfer_engine.benchmark.timing import time_ms  # noqa: E402
from ninfer_engine.kernels.gdn_chunk import chunk_gated_delta  # noqa: E402
from ninfer_engine.kernels.gdn_prep import chunk_prep_triton  # noqa: E402
from ninfer_engine.kernels.gdn_ref import chunk_prep  # noqa: E402
from ninfer_engine.kernels.gdn_ref import chunked_gated_delta, l2_normalize  # noqa: E402

# (name, nk, nv, dk, dv, GDN layers)
SHAPES = [("27B", 16, 48, 128, 128, 48), ("35B-A3B", 16, 32, 128, 128, 30)]
LENGTHS = [2048, 8192]
SWEEP = dict(block_v=[16, 32, 64], num_warps=[4, 8], num_stages=[1, 2])


def inputs(T, nk, nv, dk, dv, dev, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(T, nk, dk, generator=gen))
    k = l2_normalize(torch.randn(T, nk, dk, generator=gen))
    v = torch.randn(T, nv, dv, generator=gen)
    # the models' decays: g = -exp(A_log)·softplus(·), mostly slow with some fast heads
    g = -torch.rand(T, nv, generator=gen) * torch.logspace(-2, 0.5, nv)
    beta = torch.rand(T, nv, generator=gen)
    state = torch.randn(nv, dk, dv, generator=gen) * 0.1
    return [t.to(dev) for t in (q, k, v, g, beta, state)]


def expanded(x):
    """The torch rules' form: q / k repeated to the value heads."""
    q, k, v = x[:3]
    r = v.shape[1] // q.shape[1]
    return [q.repeat_interleave(r, 1), k.repeat_interleave(r, 1), *x[2:]]


def errors(got, ref):
    got, ref = got.double(), ref.double()
    return dict(rel_err=((got - ref).norm() / ref.norm()).item(),
                max_rel=((got - ref).abs().max() / ref.abs().max()).item())


def timed(fn, dev, n):
    if dev != "cuda":  # smoke: one wall-clock call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return time_ms(fn, n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/h200-gdn-chunk.json"))
    ap.add_argument("--sweep", action="store_true", help="kernel launch-parameter sweep")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = ap.parse_args()
    shapes, lengths, dev = SHAPES, LENGTHS, "cuda"
    if args.smoke:
        shapes, lengths, dev = [("tiny", 1, 2, 32, 32, 2)], [70], "cpu"
    assert dev == "cpu" or torch.cuda.is_available(), "CUDA only (or --smoke)"
    rows = []
    hdr = (f"{'shape':8} {'T':>5} {'torch ms':>9} {'ieee ms':>8} {'tf32 ms':>8} {'prep ms':>8} "
           f"{'prep3 ms':>8} "
           f"{'x ieee':>7} {'x tf32':>7} {'ieee err':>9} {'tf32 err':>9} {'stack tok/s tf32':>16}")
    print(hdr, flush=True)
    for (name, nk, nv, dk, dv, layers), T in itertools.product(shapes, lengths):
        x = inputs(T, nk, nv, dk, dv, dev)
        xe = expanded(x)
        ref_o, ref_s = chunked_gated_delta(*xe)
        row = dict(shape=name, nk=nk, nv=nv, dk=dk, dv=dv, T=T, layers=layers)
        row["torch_ms"] = timed(lambda: chunked_gated_delta(*xe), dev, max(2, args.reps // 3))
        for prec, tf32 in (("ieee", False), ("tf32", True)):
            o, s = chunk_gated_delta(*x, tf32=tf32)
            row[f"{prec}_out"], row[f"{prec}_state"] = errors(o, ref_o), errors(s, ref_s)
            row[f"{prec}_ms"] = timed(lambda: chunk_gated_delta(*x, tf32=tf32), dev, args.reps)
        row["prep_ms"] = timed(lambda: chunk_prep(*xe[:5], 64), dev, args.reps)
        row["prep_triton_ms"] = timed(lambda: chunk_prep_triton(*x[:5], 64, tf32=True), dev,
                                      args.reps)
        for prec in ("ieee", "tf32"):
            row[f"speedup_{prec}"] = row["torch_ms"] / row[f"{prec}_ms"]
            row[f"stack_ms_{prec}"] = row[f"{prec}_ms"] * layers
            row[f"stack_tok_s_{prec}"] = T / (row[f"{prec}_ms"] * layers) * 1e3
        row["stack_tok_s_torch"] = T / (row["torch_ms"] * layers) * 1e3
        rows.append(row)
        print(f"{name:8} {T:5d} {row['torch_ms']:9.2f} {row['ieee_ms']:8.2f} "
              f"{row['tf32_ms']:8.2f} {row['prep_ms']:8.2f} {row['prep_triton_ms']:8.2f} "
              f"{row['speedup_ieee']:7.1f} "
              f"{row['speedup_tf32']:7.1f} {row['ieee_out']['rel_err']:9.1e} "
              f"{row['tf32_out']['rel_err']:9.1e} {row['stack_tok_s_tf32']:16.0f}", flush=True)
        if dev == "cuda":
            del x, xe, ref_o, ref_s
            torch.cuda.empty_cache()

    sweep = []
    if args.sweep:
        name, nk, nv, dk, dv, _ = shapes[0]
        T = lengths[-1]
        x = inputs(T, nk, nv, dk, dv, dev)
        ref_o, _ = chunked_gated_delta(*expanded(x))
        print(f"\nsweep {name} T {T}: block_v num_warps num_stages  ieee ms  tf32 ms", flush=True)
        for bv, nw, ns in itertools.product(*SWEEP.values()):
            r = dict(block_v=bv, num_warps=nw, num_stages=ns)
            for prec, tf32 in (("ieee", False), ("tf32", True)):
                kw = dict(tf32=tf32, block_v=bv, num_warps=nw, num_stages=ns)
                try:
                    o, _ = chunk_gated_delta(*x, **kw)
                    r[f"{prec}_err"] = errors(o, ref_o)["rel_err"]
                    r[f"{prec}_ms"] = timed(lambda: chunk_gated_delta(*x, **kw), dev, args.reps)
                except Exception as exc:  # e.g. out of shared memory at 2 stages
                    r[f"{prec}_error"] = repr(exc)[:300]
            sweep.append(r)
            print(f"  {bv:7d} {nw:9d} {ns:10d} {r.get('ieee_ms', float('nan')):8.2f} "
                  f"{r.get('tf32_ms', float('nan')):8.2f}", flush=True)
        for nw in (4, 8, 16):
            ms = timed(lambda: chunk_prep_triton(*x[:5], 64, tf32=True, num_warps=nw), dev,
                       args.reps)
            sweep.append(dict(prep_num_warps=nw, prep_tf32_ms=ms))
            print(f"  prep num_warps {nw}: {ms:.2f} ms", flush=True)

    device = torch.cuda.get_device_name() if dev == "cuda" else platform.processor()
    meta = dict(device=device, torch=torch.__version__, triton=triton.__version__,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(["python3", "bench/gdn_chunk_bench.py", *sys.argv[1:]]),
                timing="CUDA events, mean of --reps calls after one warm-up (time_ms)",
                note="ms per GDN layer (core only: inputs already normalised)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows, sweep=sweep), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
