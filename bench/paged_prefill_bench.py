"""The paged prefill attention kernel at real shapes against gather + SDPA (CUDA only).

    python3 bench/paged_prefill_bench.py --out bench/results/h200-paged-prefill.json

For one attention layer of the 27B (24 query heads, 4 KV heads, head dim 256) and the 35B-A3B
(16 / 2 / 256), one 1024-token prefill chunk at cache positions `start .. start+1023` over pages
in shuffled order: the kernel reading the pages in place (bf16 and int8 KV) against the path it
replaced (gather the pages into a contiguous tensor, then `F.scaled_dot_product_attention` with
the bottom-right causal mask), both timed with CUDA events; the error is against the fp32
reference `paged_prefill_ref`. Then short chunks (16 and 64 tokens, an agent's turn) at the end
of a 32K context: the kernel with its pages split in runs (its default there) against one run
(`splits=1`, the kernel before the split).
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.benchmark.timing import time_ms  # noqa: E402
from ninfer_engine.kernels.paged_attention import PAGE, quantize_kv_int8  # noqa: E402
from ninfer_engine.kernels.paged_prefill import paged_prefill_ref, paged_prefill_triton  # noqa: E402

SHAPES = {"27b": (24, 4, 256), "35b-a3b": (16, 2, 256)}
CHUNK = 1024
SHORT = (16, 64)  # an agent turn's new tokens, at the end of a 32K context
LONG_CONTEXT = 32768


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(name, nq, nkv, D, start, kv_dtype, chunk=CHUNK):
    L = start + chunk
    pages = -(-L // PAGE)
    k = torch.randn(pages, PAGE, nkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device="cuda")
    q = torch.randn(chunk, nq, D, device="cuda", dtype=torch.bfloat16)
    scale = D**-0.5
    ks = vs = None
    if kv_dtype == "int8":
        (k, ks), (v, vs) = quantize_kv_int8(k, 32), quantize_kv_int8(v, 32)
    ref = paged_prefill_ref(q, k, v, table, start, scale, ks, vs)

    def kernel():
        return paged_prefill_triton(q, k, v, table, start, scale, ks, vs)

    def gather_sdpa():  # the bf16 path the kernel replaced (int8 would also dequantize)
        keys = k[table].flatten(0, 1)[:L].transpose(0, 1)
        values = v[table].flatten(0, 1)[:L].transpose(0, 1)
        mask = torch.ones(chunk, L, dtype=torch.bool, device="cuda").tril(start)
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None],
                                              attn_mask=mask, scale=scale, enable_gqa=True)

    row = dict(shape=name, nq=nq, nkv=nkv, D=D, start=start, chunk=chunk, kv=kv_dtype,
               rel_err=_rel(kernel(), ref), kernel_ms=time_ms(kernel, 20))
    if chunk < CHUNK:  # a short chunk: against the kernel's single run of pages
        def one_run():
            return paged_prefill_triton(q, k, v, table, start, scale, ks, vs, splits=1)
        row["one_run_ms"] = time_ms(one_run, 20)
        row["one_run_rel_err"] = _rel(one_run(), ref)
        row["speedup"] = row["one_run_ms"] / row["kernel_ms"]
    elif kv_dtype == "bf16":
        row["gather_sdpa_ms"] = time_ms(gather_sdpa, 20)
        row["speedup"] = row["gather_sdpa_ms"] / row["kernel_ms"]
    flops = 4 * nq * D * chunk * (start + chunk / 2)  # QKᵀ and PV over the causal part
    row["tflops"] = flops / row["kernel_ms"] / 1e9
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for name, (nq, nkv, D) in SHAPES.items():
        for start in (0, 7168):
            for kv in ("bf16", "int8"):
                r = run(name, nq, nkv, D, start, kv)
                rows.append(r)
                print(json.dumps(r), flush=True)
        for chunk in SHORT:
            for kv in ("bf16", "int8"):
                r = run(name, nq, nkv, D, LONG_CONTEXT - chunk, kv, chunk)
                rows.append(r)
                print(json.dumps(r), flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(["python3", "bench/paged_prefill_bench.py", *sys.argv[1:]]))
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
