"""Launch-configuration sweep of the fused MoE decode kernels on one GPU (35B-A3B shapes).

    python3 bench/moe_fused_sweep.py

For B = 1, 4, 8: the torch sequences the kernels replace (routing, gate|up + SiLU·up, down +
slot sum) against both kernel variants (`use_dot`) over block sizes and warps, each timed in a
CUDA graph, with bandwidth and relative error (H200, 2026-11-30: the register variant reached
3.3 TB/s on the down kernel, the `tl.dot` variant at most 1.6, so the register one is default).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.kernels.moe_down import (  # noqa: E402
    moe_down_combine_ref, moe_down_combine_triton)
from ninfer_engine.kernels.moe_fused import (  # noqa: E402
    moe_gate_up_silu_ref, moe_gate_up_silu_triton, route_topk_triton)
from ninfer_engine.kernels.moe_gemv import moe_gemv_triton  # noqa: E402


def _bench(E=256, k=8, H=2048, I=512, batches=(1, 4, 8), device="cuda", timer=None):
    """35B-A3B shapes by default; `timer(fn) -> µs` defaults to CUDA-graph timing."""
    torch.manual_seed(0)
    w_gu = torch.randn(E, 2 * I, H, device=device, dtype=torch.bfloat16) / H ** 0.5
    w_down = torch.randn(E, H, I, device=device, dtype=torch.bfloat16) / I ** 0.5
    router = torch.randn(E, H, device=device, dtype=torch.bfloat16) / H ** 0.5

    def _rel(out, ref):
        return ((out.double() - ref.double()).norm() / ref.double().norm()).item()

    def t(fn):
        if timer is not None:
            return timer(fn)
        from triton.testing import do_bench_cudagraph
        return do_bench_cudagraph(fn, rep=50) * 1e3  # µs

    for B in batches:
        y = torch.randn(B, H, device=device, dtype=torch.bfloat16)
        logits = F.linear(y, router)
        w, ids = route_topk_triton(logits, k, True)
        ids = ids.view(-1)
        act = moe_gate_up_silu_triton(y, w_gu, ids)
        act_ref = moe_gate_up_silu_ref(y, w_gu, ids)
        out_ref = moe_down_combine_ref(act, w_down, ids, w, B, k)
        gu_bytes, down_bytes = B * k * 2 * I * H * 2, B * k * H * I * 2  # upper bounds

        def torch_route():
            p = torch.softmax(logits.float(), -1)
            ww, ii = torch.topk(p, k, -1)
            return ww / ww.sum(-1, keepdim=True), ii

        rows = y[:, None].expand(B, k, H).reshape(B * k, H)

        def torch_gate_up():
            g, u = moe_gemv_triton(rows, w_gu, ids).chunk(2, -1)
            return F.silu(g) * u

        def torch_down():
            d = moe_gemv_triton(act, w_down, ids)
            return (d.view(B, k, -1) * w.to(act.dtype)[..., None]).float().sum(1).to(act.dtype)

        print(f"B={B}: route torch {t(torch_route):.1f} µs, fused "
              f"{t(lambda: route_topk_triton(logits, k, True)):.1f} µs")
        print(f"  gate_up+silu torch seq {t(torch_gate_up):.1f} µs "
              f"({gu_bytes / 2**20:.0f} MiB max)")
        for use_dot, bi, bk, nw in itertools.product((False, True), (8, 16, 32), (128, 256, 512),
                                                     (4, 8)):
            if use_dot and bi < 16:
                continue
            us = t(lambda: moe_gate_up_silu_triton(y, w_gu, ids, bi, bk, use_dot, nw))
            err = _rel(moe_gate_up_silu_triton(y, w_gu, ids, bi, bk, use_dot, nw), act_ref)
            print(f"    dot={use_dot:d} BI={bi} BK={bk} warps={nw}: {us:.1f} µs "
                  f"{gu_bytes / us / 1e6:.2f} TB/s  rel.err {err:.1e}")
        print(f"  down+combine torch seq {t(torch_down):.1f} µs "
              f"({down_bytes / 2**20:.0f} MiB max)")
        for use_dot, bh, bk, nw in itertools.product((False, True), (4, 8, 16, 32), (128, 256, 512),
                                                     (4, 8)):
            if use_dot and bh < 16:
                continue
            us = t(lambda: moe_down_combine_triton(act, w_down, ids, w, B, k, bh, bk, use_dot, nw))
            err = _rel(moe_down_combine_triton(act, w_down, ids, w, B, k, bh, bk, use_dot, nw),
                       out_ref)
            print(f"    dot={use_dot:d} BH={bh} BK={bk} warps={nw}: {us:.1f} µs "
                  f"{down_bytes / us / 1e6:.2f} TB/s  rel.err {err:.1e}")


if __name__ == "__main__":
    _bench()
