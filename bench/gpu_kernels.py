"""Each Triton decode kernel against its torch reference at real model shapes, on one GPU.

    python3 bench/gpu_kernels.py [--out bench/results/h200-kernels.json]

Measures the device copy bandwidth first (a 2 GiB device-to-device copy, bytes read plus
written), then for every kernel and shape: the error against the fp32 torch reference
(‖out − ref‖ / ‖ref‖, max |out − ref|), the median time of the Triton kernel and of the
torch path it replaces (`triton.testing.do_bench`, which flushes L2 before each call, so the
times are cold-cache like a decode step), the fewest bytes the op must move and the achieved
fraction of the copy bandwidth. Shapes: Qwen3.5/3.6-27B (H 5120) and 35B-A3B (H 2048).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ninfer_engine.kernels import dequant_gemv as dq  # noqa: E402
from ninfer_engine.kernels import dequant_gemv_kernels as dqk  # noqa: E402
from ninfer_engine.kernels import gdn_decode as gd  # noqa: E402
from ninfer_engine.kernels import moe_gemv as mg  # noqa: E402
from ninfer_engine.kernels import paged_attention as pa  # noqa: E402
from ninfer_engine.kernels import rmsnorm, rotary, sampling  # noqa: E402

DEV = "cuda"
ROWS: list[dict] = []
# (name, hidden) / (name, nq, nkv, D) / (name, nv) / contexts / vocab: real model shapes
NORM_SHAPES = [5120, 2048]
NORM_ROWS = [1, 8, 4096]
ROPE_SHAPES = [("27B q", 24, 256), ("35B q", 16, 256)]
ROPE_T = [1, 4096]
ATTN_SHAPES = [("27B", 24, 4, 256), ("35B-A3B", 16, 2, 256)]
ATTN_CTX = [4096, 32768]
GDN_SHAPES = [("27B", 16, 48, 128), ("35B-A3B", 16, 32, 128)]
VOCAB = 248320
GEMV_SHAPES = [
    ("27B gdn qkv", 10240, 5120), ("27B mlp gate", 17408, 5120), ("27B mlp down", 5120, 17408),
    ("27B attn o", 5120, 6144), ("27B lm_head", 248320, 5120),
    ("35B attn q+gate", 8192, 2048), ("35B shared up", 512, 2048), ("35B lm_head", 248320, 2048),
]


def smoke_shapes():
    """Tiny shapes and the CPU interpreter: checks the script's plumbing, not speed."""
    global DEV, NORM_SHAPES, NORM_ROWS, ROPE_SHAPES, ROPE_T, ATTN_SHAPES, ATTN_CTX
    global GDN_SHAPES, VOCAB, GEMV_SHAPES
    global MOE_SHAPES
    DEV, NORM_SHAPES, NORM_ROWS, ROPE_T, ATTN_CTX, VOCAB = "cpu", [64], [2], [3], [130], 5000
    MOE_SHAPES = [("t", 10, 48, 64, True)]
    ROPE_SHAPES, ATTN_SHAPES, GDN_SHAPES = [("t", 2, 96)], [("t", 4, 2, 32)], [("t", 2, 4, 32)]
    GEMV_SHAPES = [("t", 48, 256)]


def bench_ms(fn):
    """Median ms; on the CPU (smoke runs) a single wall-clock call."""
    if DEV != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return do_bench(fn, warmup=20, rep=60, return_mode="median")


def copy_bandwidth():
    """Bytes read + written per second by a large device-to-device copy."""
    src = torch.randn(2 << 29 if DEV == "cuda" else 1 << 20, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6  # GB/s


def errors(out, ref):
    o, r = out.double(), ref.double()
    return (o - r).norm().item() / r.norm().item(), (o - r).abs().max().item()


def record(kernel, shape, out, ref, tri_fn, ref_fn, nbytes, bw, ref_name="torch"):
    rel, mx = errors(out, ref) if out is not None else (None, None)
    t_tri, t_ref = bench_ms(tri_fn), bench_ms(ref_fn)
    row = dict(kernel=kernel, shape=shape, rel_err=rel, max_abs_err=mx, triton_us=t_tri * 1e3,
               ref_us=t_ref * 1e3, ref_path=ref_name, bytes=nbytes,
               triton_gbps=nbytes / t_tri / 1e6, frac_copy_bw=nbytes / t_tri / 1e6 / bw,
               speedup_vs_ref=t_ref / t_tri)
    ROWS.append(row)
    print(f"{kernel:16s} {shape:44s} err {rel if rel is not None else float('nan'):.2e} "
          f"triton {t_tri * 1e3:9.1f} us  {ref_name} {t_ref * 1e3:9.1f} us  "
          f"{row['frac_copy_bw'] * 100:5.1f}% bw", flush=True)


def bench_rmsnorm(bw):
    for h in NORM_SHAPES:
        for rows in NORM_ROWS:
            x, r = (torch.randn(rows, h, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            w = torch.randn(h, device=DEV)
            y, _ = rmsnorm.rms_norm_triton(x, w, 1e-6, r, True)
            ref, _ = rmsnorm.rms_norm_ref(x, w, 1e-6, r, True)
            record("rmsnorm+res(1+w)", f"rows {rows} H {h}", y, ref,
                   lambda: rmsnorm.rms_norm_triton(x, w, 1e-6, r, True),
                   lambda: rmsnorm.rms_norm_ref(x, w, 1e-6, r, True), 4 * x.numel() * 2, bw)


def bench_rope(bw):
    for name, heads, D in ROPE_SHAPES:
        for T in ROPE_T:
            x = torch.randn(T, heads, D, device=DEV, dtype=torch.bfloat16)
            pos = torch.arange(T, device=DEV) + 31000
            record("rope partial 64", f"{name} T {T} x{heads}x{D}",
                   rotary.rope_triton(x, pos, 64, 1e7), rotary.rope_ref(x, pos, 64, 1e7),
                   lambda: rotary.rope_triton(x, pos, 64, 1e7),
                   lambda: rotary.rope_ref(x, pos, 64, 1e7), 2 * x.numel() * 2, bw)


def bench_paged_attention(bw):
    for name, nq, nkv, D in ATTN_SHAPES:
        for ctx in ATTN_CTX:
            for B in (1, 8):
                for quant in (False, True):
                    n_pages = B * -(-ctx // pa.PAGE)
                    table = torch.randperm(n_pages, device=DEV).int().view(B, -1)
                    lens = torch.full((B,), ctx, device=DEV, dtype=torch.int32)
                    q = torch.randn(B, nq, D, device=DEV, dtype=torch.bfloat16)
                    k, v = (torch.randn(n_pages, pa.PAGE, nkv, D, device=DEV,
                                        dtype=torch.bfloat16) for _ in range(2))
                    ks = vs = None
                    if quant:
                        (k, ks), (v, vs) = pa.quantize_kv_int8(k, 32), pa.quantize_kv_int8(v, 32)
                    args = (q, k, v, table, lens, ks, vs)
                    # bytes of the ctx tokens actually read (pages are full at these lengths)
                    kv_bytes = 2 * sum(t.numel() * t.element_size() for t in (k, ks)
                                       if t is not None) * ctx // (n_pages // B * pa.PAGE)
                    record("paged_attn " + ("int8g32" if quant else "bf16"),
                           f"{name} ctx {ctx} B {B}", pa.paged_attention_triton(*args, ctx),
                           pa.paged_attention_ref(*args),
                           lambda: pa.paged_attention_triton(*args, ctx),
                           lambda: pa.paged_attention_ref(*args), kv_bytes, bw,
                           "torch gather+einsum")
                    del k, v, ks, vs


def bench_gdn(bw):
    for name, nk, nv, dh in GDN_SHAPES:
        for B in (1, 8):
            q, k = (torch.randn(B, nk, dh, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(B, nv, dh, device=DEV, dtype=torch.bfloat16)
            g = -torch.rand(B, nv, device=DEV)
            beta = torch.rand(B, nv, device=DEV)
            state = torch.randn(B, nv, dh, dh, device=DEV) * 0.1
            s_ref, s_tri = state.clone(), state.clone()
            o_ref = gd.gdn_decode_ref(q, k, v, g, beta, s_ref)
            o = gd.gdn_decode_triton(q, k, v, g, beta, s_tri)
            rel_state, _ = errors(s_tri, s_ref)
            nbytes = 2 * state.numel() * 4
            record("gdn_decode", f"{name} B {B} nv {nv} state fp32", o, o_ref,
                   lambda: gd.gdn_decode_triton(q, k, v, g, beta, s_tri),
                   lambda: gd.gdn_decode_ref(q, k, v, g, beta, s_ref), nbytes, bw)
            ROWS[-1]["state_rel_err"] = rel_state


GEMV_CONFIGS = [(32, 128, 4, 3), (64, 128, 4, 3), (64, 256, 4, 3), (128, 128, 8, 3),
                (32, 512, 4, 3), (64, 256, 8, 4)]  # (BN, BK, warps, stages)
SWEEP_SHAPES = ["27B mlp gate", "27B mlp down", "27B attn o", "35B attn q+gate"]


def sweep_gemv(bw):
    """Tile configurations of the dequant GEMV at batch 1; the best per shape is recorded."""
    for name, N, K in GEMV_SHAPES:
        if name not in SWEEP_SHAPES:
            continue
        w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, K, device=DEV, dtype=torch.bfloat16)
        for enc, (codes, scale) in (("fp8_row", dq.quantize_fp8_row(w)),
                                    ("q8_g32", dq.quantize_q8_g32(w))):
            nbytes = codes.numel() + scale.numel() * scale.element_size()
            times = {}
            for bn, bk, nw, ns in GEMV_CONFIGS:
                def fn():
                    return dqk.dequant_gemv_triton(x, codes, scale, bn, bk, nw, ns)
                times[(bn, bk, nw, ns)] = bench_ms(fn)
            best = min(times, key=times.get)
            ROWS.append(dict(kernel=f"gemv {enc} sweep", shape=f"{name} {N}x{K} B 1",
                             times_us={str(c): t * 1e3 for c, t in times.items()},
                             best=str(best), triton_us=times[best] * 1e3, bytes=nbytes,
                             frac_copy_bw=nbytes / times[best] / 1e6 / bw))
            print(f"sweep {enc} {name}: best {best} {times[best] * 1e3:.1f} us "
                  f"{ROWS[-1]['frac_copy_bw'] * 100:.1f}% bw; "
                  + " ".join(f"{c}:{t * 1e3:.0f}" for c, t in times.items()), flush=True)


def bench_gemv(bw):
    for name, N, K in GEMV_SHAPES:
        w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
        encs = {"fp8_row": dq.quantize_fp8_row(w), "q8_g32": dq.quantize_q8_g32(w)}
        for B in (1, 8):
            x = torch.randn(B, K, device=DEV, dtype=torch.bfloat16)
            for enc, (codes, scale) in encs.items():
                ref = x.float() @ dq.dequantize(codes, scale).t()
                nbytes = sum(t.numel() * t.element_size() for t in (codes, scale))
                # the torch path it replaces: cuBLAS bf16 over the unquantised weight
                record(f"gemv {enc}", f"{name} {N}x{K} B {B}",
                       dqk.dequant_gemv_triton(x, codes, scale), ref,
                       lambda: dqk.dequant_gemv_triton(x, codes, scale),
                       lambda: F.linear(x, w), nbytes, bw, "cuBLAS bf16 F.linear")


MOE_SHAPES = [("35B experts gate|up", 256, 1024, 2048, False),
              ("35B experts down", 256, 2048, 512, True)]  # (name, E, N, K, x per slot)


def bench_moe(bw):
    for name, E, N, K, per_slot in MOE_SHAPES:
        w = torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16) * 0.02
        ids = torch.randperm(E, device=DEV)[:8]
        x = torch.randn(8 if per_slot else 1, K, device=DEV, dtype=torch.bfloat16)
        record("moe_gemv top-8", f"{name} {E}x{N}x{K}", mg.moe_gemv_triton(x, w, ids),
               mg.moe_gemv_ref(x, w, ids), lambda: mg.moe_gemv_triton(x, w, ids),
               lambda: mg.moe_gemv_ref(x, w, ids), 8 * N * K * 2, bw, "torch gather+einsum")


def bench_sampling(bw):
    V = VOCAB
    for B in (1, 8):
        logits = torch.randn(B, V, device=DEV, dtype=torch.bfloat16) * 4
        am = sampling.argmax_triton(logits)
        ok = bool(torch.equal(am, logits.argmax(-1)))
        record("argmax", f"V {V} B {B}", None, None, lambda: sampling.argmax_triton(logits),
               lambda: logits.argmax(-1), logits.numel() * 2, bw)
        ROWS[-1]["exact_match"] = ok
        vals, ids = sampling.topk_triton(logits, 20)
        ref_vals, _ = torch.topk(logits.float(), 20, -1)
        record("topk k=20", f"V {V} B {B}", vals, ref_vals,
               lambda: sampling.topk_triton(logits, 20),
               lambda: torch.topk(logits, 20, -1), logits.numel() * 2, bw)
        ROWS[-1]["ids_match"] = bool(torch.equal(logits.float().gather(1, ids), vals))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/h200-kernels.json"))
    ap.add_argument("--only", default="", help="comma-separated subset of sections")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = ap.parse_args()
    if args.smoke:
        smoke_shapes()
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name() if DEV == "cuda" else platform.processor()
    print(f"copy bandwidth {bw:.0f} GB/s on {device}", flush=True)
    sections = dict(rmsnorm=bench_rmsnorm, rope=bench_rope, gdn=bench_gdn, gemv=bench_gemv,
                    sweep=sweep_gemv, moe=bench_moe,
                    attention=bench_paged_attention, sampling=bench_sampling)
    for name, fn in sections.items():
        if not args.only or name in args.only.split(","):
            try:
                fn(bw)
            except Exception as exc:  # record and go on: one device call covers every section
                ROWS.append(dict(kernel=name, error=repr(exc)[:500]))
                print("ERROR", name, repr(exc)[:500], flush=True)
            if DEV == "cuda":
                torch.cuda.empty_cache()
    meta = dict(device=device, torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(),
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command="python3 bench/gpu_kernels.py", copy_gbps=bw,
                timing="triton.testing.do_bench median, L2 flushed before each call")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=ROWS), indent=1))
    assert all(r.get("rel_err") is None or math.isfinite(r["rel_err"]) for r in ROWS)


if __name__ == "__main__":
    main()
