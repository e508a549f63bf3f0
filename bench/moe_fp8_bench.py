"""fp8 routed experts on one GPU (Flash-Next shapes: E = 512, top-10, H = 2048, I = 512).

    python3 bench/moe_fp8_bench.py [--quick]

Decode: the fused gate|up + SiLU·up and down + slot-sum kernels over bf16, fp8-row and fp8-group
(G = 64, the Q4/Q5 repack) stacks, each timed in a CUDA graph: µs, TB/s over the bytes of the
slots' experts (codes + scales), relative error against the torch reference of the same stack;
`--quick`: the default tiles at B = 1, 4, 8, else tile variants of the fp8 forms at B = 1, 8.
Prefill: decoding the routed experts of a 1024-token chunk (`dequantize_routed`, every expert
routed) against the bf16 gate|up grouped matmul.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.kernels.moe_dequant import dequantize_routed  # noqa: E402
from ninfer_engine.kernels.moe_down import (  # noqa: E402
    moe_down_combine_ref, moe_down_combine_triton)
from ninfer_engine.kernels.moe_fused import (  # noqa: E402
    moe_gate_up_silu_ref, moe_gate_up_silu_triton, route_topk_triton)


def _t(fn):
    from triton.testing import do_bench_cudagraph
    return do_bench_cudagraph(fn, rep=50) * 1e3  # µs


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _stack(w, form):
    """(codes or weights, scale) of bf16 `w [E, N, K]` in `form`."""
    if form == "bf16":
        return w, None
    if form == "row":
        s = (w.float().abs().amax(-1) / 448).clamp_min(1e-12)
        return (w.float() / s[..., None]).to(torch.float8_e4m3fn), s.bfloat16()
    g = w.float().unflatten(-1, (-1, 64))
    s = (g.abs().amax(-1) / 16).clamp_min(1e-8)  # integer codes |q| ≤ 16, as Q4/Q5 repacked
    q = torch.round(g / s[..., None]).clamp(-16, 16).flatten(-2)
    return q.to(torch.float8_e4m3fn), s.half()


def main(quick: bool = False, E=512, k=10, H=2048, I=512):
    torch.manual_seed(0)
    dev = "cuda"
    gu16 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) / H ** 0.5
    dn16 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) / I ** 0.5
    router = torch.randn(E, H, device=dev, dtype=torch.bfloat16) / H ** 0.5
    stacks = {f: (_stack(gu16, f), _stack(dn16, f)) for f in ("bf16", "row", "group")}
    for B in (1, 4, 8) if quick else (1, 8):
        y = torch.randn(B, H, device=dev, dtype=torch.bfloat16)
        w, ids = route_topk_triton(y @ router.t(), k, True)
        ids = ids.view(-1)
        for form, ((gu, gs), (dn, ds)) in stacks.items():
            per = lambda t, s: t[0].numel() * t.element_size() + (  # noqa: E731
                0 if s is None else s[0].numel() * s.element_size())
            gu_bytes, dn_bytes = B * k * per(gu, gs), B * k * per(dn, ds)
            act_ref = moe_gate_up_silu_ref(y, gu, ids, gs)
            act = moe_gate_up_silu_triton(y, gu, ids, scale=gs)
            out_ref = moe_down_combine_ref(act, dn, ids, w, B, k, ds)
            tiles = [(16, 512, 8)] if quick or form == "bf16" else list(
                itertools.product((16, 32), (512, 1024), (4, 8)))
            for bi, bk, nw in tiles:
                def fn():
                    return moe_gate_up_silu_triton(y, gu, ids, bi, bk, False, nw, scale=gs)
                us = _t(fn)
                print(f"B={B} {form:5s} gate_up BI={bi} BK={bk} warps={nw}: {us:7.1f} µs "
                      f"{gu_bytes / us / 1e6:.2f} TB/s rel.err {_rel(fn(), act_ref):.1e}")
            tiles = [(8, 512, 4)] if quick or form == "bf16" else list(
                itertools.product((4, 8, 16), (256, 512), (4, 8)))
            for bh, bk, nw in tiles:
                def fn():
                    return moe_down_combine_triton(act, dn, ids, w, B, k, bh, bk, False, nw,
                                                   scale=ds)
                us = _t(fn)
                print(f"B={B} {form:5s} down    BH={bh} BK={bk} warps={nw}: {us:7.1f} µs "
                      f"{dn_bytes / us / 1e6:.2f} TB/s rel.err {_rel(fn(), out_ref):.1e}")
    # prefill: one 1024-token chunk routes (nearly) every expert
    counts = torch.full((E,), 20, device=dev, dtype=torch.int64)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = torch.randn(int(counts.sum()), H, device=dev, dtype=torch.bfloat16)
    mm = _t(lambda: torch._grouped_mm(xs, gu16.transpose(-2, -1), offs=offs))
    print(f"prefill chunk ({xs.shape[0]} rows): bf16 gate|up grouped_mm {mm:.0f} µs")
    for form in ("row", "group"):
        (gu, gs), _ = stacks[form]
        out = torch.empty(gu.shape, device=dev, dtype=torch.bfloat16)
        us = _t(lambda: dequantize_routed(gu, gs, counts, out))
        moved = gu.numel() * 3
        print(f"  {form}: dequantize_routed gate|up {us:.0f} µs ({moved / us / 1e6:.2f} TB/s "
              "counting 1 B read + 2 B written a weight)")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
