"""fp8 routed experts: the fused decode kernels with row / group scales, and prefill's routed-only
dequantization, against torch references (dequantize, then the bf16 path's fp32 math)."""

import pytest
import torch

from ninfer_engine.kernels.moe_dequant import (dequantize_experts, dequantize_routed_ref,
                                               dequantize_routed_triton)
from ninfer_engine.kernels.moe_down import moe_down_combine_ref, moe_down_combine_triton
from ninfer_engine.kernels.moe_fused import moe_gate_up_silu_ref, moe_gate_up_silu_triton

from tests.tolerance import CAST, TRANSCENDENTAL, assert_rounded_once, bound

from .conftest import down_exact, gate_up_exact, rel_err

BF16 = torch.bfloat16


def fp8_stack(E, N, K, layout, gen, group=16):
    """Random stacked experts as e4m3 codes + scales: fp8-row (absmax → 448, bf16 scales) or
    integer codes |q| ≤ 16 with fp16 group scales (the exact form of Q4/Q5 groups)."""
    w = torch.randn(E, N, K, generator=gen) / K ** 0.5
    if layout == "row":
        scale = (w.abs().amax(-1) / 448).bfloat16()
        codes = (w / scale.float()[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        return codes, scale
    q = torch.randint(-16, 17, (E, N, K), generator=gen).float()
    scale = (torch.rand(E, N, K // group, generator=gen) * 0.02 + 0.001).half()
    return q.to(torch.float8_e4m3fn), scale


def _rounded_once(out, exact_noise):
    """Within half a bf16 ulp of the fp64 value plus the fp32 accumulation noise bound."""
    assert_rounded_once(out, *exact_noise)


# the dequantized weights (e4m3 × bf16 row scale, |q| ≤ 16 × fp16 group scale) are exact in fp32
def _exact_gate_up(x, codes, scale, ids):
    return gate_up_exact(x, dequantize_experts(codes, scale, ids, torch.float64), ids)


def _exact_down(act, codes, scale, ids, weights, B, k):
    terms, noise = down_exact(act, dequantize_experts(codes, scale, ids, torch.float64),
                              weights, B, k)
    return terms.sum(1), noise


# (E, I, H, block_k): tiles that divide the shapes, and an H / I tail (72 = 2·32 + 8, 24)
SHAPES = [(8, 32, 64, 32), (6, 24, 72, 32)]


def fp8_cases(test):
    """Both expert kernels' cases: row and group scales, one and several rows, even and tail
    shapes, the register and the `tl.dot` variant."""
    for mark in (pytest.mark.parametrize("use_dot", [False, True]),
                 pytest.mark.parametrize("shape", SHAPES, ids=["even", "tails"]),
                 pytest.mark.parametrize("B,k", [(1, 3), (3, 2)]),
                 pytest.mark.parametrize("layout", ["row", "group"])):
        test = mark(test)
    return test


@fp8_cases
def test_gate_up_silu_fp8(device, layout, B, k, shape, use_dot):
    E, I, H, bk = shape
    g = torch.Generator().manual_seed(B * 7 + k)
    codes, scale = fp8_stack(E, 2 * I, H, layout, g, group=8)
    ids = torch.randint(0, E, (B * k,), generator=g)
    x = torch.randn(B, H, generator=g).bfloat16()
    out = moe_gate_up_silu_triton(x.to(device), codes.to(device), ids.to(device), block_i=16,
                                  block_k=bk, use_dot=use_dot, scale=scale.to(device))
    assert out.dtype == torch.bfloat16 and out.shape == (B * k, I)
    exact = _exact_gate_up(x, codes, scale, ids)
    _rounded_once(out, exact)
    # the same fp32 value (dots, SiLU, product), each side rounded once to bf16
    tol = bound(BF16, H + TRANSCENDENTAL + 3, roundings=1)
    assert rel_err(out, moe_gate_up_silu_ref(x, codes, ids, scale)) < tol


@fp8_cases
def test_down_combine_fp8(device, layout, B, k, shape, use_dot):
    E, I, H, bk = shape
    g = torch.Generator().manual_seed(B * 5 + k)
    codes, scale = fp8_stack(E, H, I, layout, g, group=8)
    ids = torch.randint(0, E, (B * k,), generator=g)
    act = torch.randn(B * k, I, generator=g).bfloat16()
    weights = torch.softmax(torch.randn(B, k, generator=g), -1)
    out = moe_down_combine_triton(act.to(device), codes.to(device), ids.to(device),
                                  weights.to(device), B, k, block_h=16, block_k=bk,
                                  use_dot=use_dot, scale=scale.to(device))
    assert out.dtype == torch.bfloat16 and out.shape == (B, H)
    _rounded_once(out, _exact_down(act, codes, scale, ids, weights, B, k))
    # the same fp32 value (dots, weight products, slot sum), each side rounded once to bf16
    tol = bound(BF16, I + 1 + k, roundings=1)
    assert rel_err(out, moe_down_combine_ref(act, codes, ids, weights, B, k, scale)) < tol


def test_fp8_decode_matches_its_bf16_expansion(device):
    """The same experts served fp8 and expanded to bf16 (what auto does when bf16 fits) agree
    to bf16 rounding: the expansion rounds each weight (q · fp16 scale) to bf16, the fp8 path
    multiplies in fp32."""
    g = torch.Generator().manual_seed(11)
    E, I, H, B, k = 8, 32, 128, 3, 4
    gu, gu_s = fp8_stack(E, 2 * I, H, "group", g, group=64)
    dn, dn_s = fp8_stack(E, H, I, "row", g)
    ids = torch.randint(0, E, (B * k,), generator=g).to(device)
    x = torch.randn(B, H, generator=g).bfloat16().to(device)
    weights = torch.softmax(torch.randn(B, k, generator=g), -1).to(device)
    gu16 = dequantize_experts(gu, gu_s, dtype=torch.bfloat16).to(device)
    dn16 = dequantize_experts(dn, dn_s, dtype=torch.bfloat16).to(device)
    act = moe_gate_up_silu_triton(x, gu.to(device), ids, scale=gu_s.to(device))
    # each side rounds its output once; the expansion also casts every weight to bf16 (a
    # relative error CAST·u per weight, so per |term| of the dot)
    tol = bound(BF16, H + TRANSCENDENTAL + 3, roundings=1 + CAST)
    assert rel_err(act, moe_gate_up_silu_triton(x, gu16, ids)) < tol
    out = moe_down_combine_triton(act, dn.to(device), ids, weights, B, k, scale=dn_s.to(device))
    tol = bound(BF16, I + 1 + k, roundings=1 + CAST)
    assert rel_err(out, moe_down_combine_triton(act, dn16, ids, weights, B, k)) < tol


@pytest.mark.parametrize("layout", ["row", "group"])
def test_dequantize_routed_touches_only_routed_experts(device, layout):
    g = torch.Generator().manual_seed(3)
    E, N, K = 6, 24, 48
    codes, scale = fp8_stack(E, N, K, layout, g)
    counts = torch.tensor([0, 3, 0, 1, 7, 0], dtype=torch.int64)
    out = torch.full((E, N, K), -1.0).bfloat16()
    got = dequantize_routed_triton(codes.to(device), scale.to(device), counts.to(device),
                                   out.to(device), block=256).cpu()
    ref = dequantize_routed_ref(codes, scale, counts, out.clone())
    routed = counts > 0
    assert (got[~routed] == -1).all() and (ref[~routed] == -1).all()
    # within one bf16 ulp: the interpreter's fp32 → bf16 cast truncates (GPUs round)
    torch.testing.assert_close(got[routed], ref[routed], rtol=2 ** -7, atol=0)
