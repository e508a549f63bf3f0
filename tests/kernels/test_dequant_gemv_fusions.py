"""The dequant GEMV's fusions for the decode step: the gated input `x · act(gate)` (SwiGLU's
`silu(g) · u` before the down projection, the attention output gate before o_proj) and the fp32
accumulation into a caller's buffer, against the unfused torch composition they replace."""

import pytest
import torch

from ninfer_engine.kernels._dispatch import interpreting
from ninfer_engine.kernels.dequant_gemv import (
    dequant_gemv,
    dequant_gemv_ref,
    dequantize,
    engine_launch,
    gated_ref,
    quantize_fp8_groups,
    quantize_fp8_row,
)
from ninfer_engine.kernels.dequant_gemv_kernels import dequant_gemv_triton

from tests.tolerance import CAST, TRANSCENDENTAL, assert_within, bound, gamma, unit_roundoff

from .conftest import rel_err

K = 256
BF16, F32 = torch.bfloat16, torch.float32
# the bf16 GEMV of a gated input against the same product elsewhere: the fp32 K-term sum (an fp8
# code times its fp32 scale rounds once more), the gate's two bf16 casts (act, product) and
# the output's, each side; CAST covers the interpreter's truncating casts
GATED = bound(BF16, K + 1, roundings=3 * CAST)


def _weights(n, form, gen):
    w = torch.randn(n, K, generator=gen) / 8
    if form == "bf16":
        return w.bfloat16(), None
    return quantize_fp8_row(w) if form == "fp8_row" else quantize_fp8_groups(w, 64)


def _gate_up(batch, gen):
    """A gate|up row pair as the decode step has it: the halves of one [B, 2K] output."""
    return (torch.randn(batch, 2 * K, generator=gen) * 3).bfloat16()


@pytest.mark.parametrize("form", ["bf16", "fp8_row", "fp8_g64"])
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_gated_input_equals_the_unfused_ops(device, form, act):
    batch = 1  # the fma variant's; several rows refuse the gate (below)
    gen = torch.Generator().manual_seed(7 + len(form) + len(act))
    codes, scale = _weights(40, form, gen)
    gu = _gate_up(batch, gen)
    gate, x = gu[:, :K], gu[:, K:]
    xg = gated_ref(x, gate, act)
    want = dequant_gemv_ref(xg, codes, scale)
    kw = engine_launch(batch, 40, K, codes, scale, sms=4)
    dev = gu.to(device)
    got = dequant_gemv_triton(xg.to(device), codes.to(device), _to(scale, device), **kw)
    fused = dequant_gemv_triton(dev[:, K:], codes.to(device), _to(scale, device),
                                gate=dev[:, :K], act=act, **kw)
    # the prologue rounds as the two elementwise ops do: the same GEMV input, so the same sums
    # (the interpreter truncates fp32 -> bf16 casts where GPUs round to nearest: close only)
    if interpreting():
        assert rel_err(fused, got) < GATED
    else:
        assert torch.equal(fused.cpu(), got.cpu())
    assert rel_err(fused, want) < GATED
    # and the gate matters: the plain product of x differs
    plain = dequant_gemv_triton(dev[:, K:].contiguous(), codes.to(device), _to(scale, device),
                                **kw)
    assert rel_err(plain, fused) > 0.1


def test_several_rows_refuse_the_gate(device):
    """The dot path does not gate its input (3-4x slower there, h200-gemv-fusions.md): asking
    is an error, and the entry point gates first instead."""
    gen = torch.Generator().manual_seed(3)
    codes, scale = _weights(40, "fp8_row", gen)
    gu = _gate_up(3, gen).to(device)
    args = (gu[:, K:], codes.to(device), scale.to(device))
    with pytest.raises(ValueError):
        dequant_gemv_triton(*args, gate=gu[:, :K], act="silu")
    got = dequant_gemv(*args, gate=gu[:, :K], act="silu")
    want = dequant_gemv_ref(gated_ref(gu[:, K:], gu[:, :K], "silu").cpu(), codes, scale)
    assert rel_err(got, want) < GATED


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("form", ["bf16", "fp8_row", "fp8_g64"])
def test_out_accumulates_fp32_sums(device, batch, form):
    gen = torch.Generator().manual_seed(31 + batch + len(form))
    codes, scale = _weights(40, form, gen)
    x = torch.randn(batch, K, generator=gen).bfloat16()
    exact = x.float() @ dequantize(codes, scale).t()
    base = torch.randn(batch, 40, generator=gen)
    out = base.clone().to(device)
    kw = engine_launch(batch, 40, K, codes, scale, sms=4)
    got = dequant_gemv_triton(x.to(device), codes.to(device), _to(scale, device), out=out, **kw)
    assert got is out and got.dtype == torch.float32
    # added, not stored, and not rounded to bf16 on the way: both sides' K-term fp32 sums
    # (γ_K·Σ|xᵢwᵢ| each, an fp8 code × scale one more rounding) and the add
    terms = x.double().abs() @ dequantize(codes, scale).double().abs().t()
    noise = 2 * gamma(F32, K + 1) * terms + 2 * unit_roundoff(F32) * (base + exact).abs()
    assert_within(got, base + exact, noise)


def test_entry_point_applies_both_fusions_on_every_path(device):
    """`dequant_gemv` takes the kernel where it tiles K and the torch path where it does not
    (K = 24): both honour gate/act and out."""
    gen = torch.Generator().manual_seed(5)
    for k in (K, 24):
        w = (torch.randn(16, k, generator=gen) / 8).bfloat16()
        gu = (torch.randn(1, 2 * k, generator=gen) * 3).bfloat16()
        want = gated_ref(gu[:, k:], gu[:, :k], "silu").float() @ w.float().t()
        out = torch.zeros(1, 16, device=device)
        dev = gu.to(device)
        got = dequant_gemv(dev[:, k:], w.to(device), None, gate=dev[:, :k], act="silu", out=out)
        assert got is out
        # the same bf16 gated input (the torch gate on the CPU, the kernel's rounds to nearest
        # on a GPU), then k-term fp32 sums and the add into zeros, each side
        assert rel_err(got, want) < bound(F32, k + 1)


def _to(t, device):
    return None if t is None else t.to(device)


@pytest.mark.parametrize("form", ["bf16", "fp8_row"])
def test_several_rows_without_out_take_whole_k_programs_where_measured(device, form):
    """Several rows of fp8-row codes (a verify row's projections on the fp8-row recipe) and
    a short plain matrix (the router|score): whole-K programs, one launch, no K split's fp32
    partials, reduce and cast (bench/results/h100-verify-gemv-split.md), as the split
    launch sums the same products; group scales, `out` and unmeasured shapes keep the split."""
    gen = torch.Generator().manual_seed(11)
    w8, s8 = _weights(40, "fp8_row", gen)
    _, g64 = _weights(40, "fp8_g64", gen)
    assert engine_launch(4, 12352, 2048, w8, s8) == {"block_n": 32, "split": 1}
    assert engine_launch(8, 9216, 2048, w8, s8) == {"block_n": 32, "split": 1}
    assert engine_launch(4, 257, 2048, w8, s8) == {"block_n": 16, "split": 1}
    assert engine_launch(4, 2048, 2048, w8, s8, sms=132) == {}  # 64 programs < the SMs
    assert engine_launch(4, 16480, 5120, w8, s8) == {}  # the 27B's K: not measured
    assert "split" not in engine_launch(4, 257, 2048, w8, g64)  # group scales: unchanged
    assert "split" not in engine_launch(4, 257, 2048, w8, s8, accumulate=True)
    assert engine_launch(4, 12352, 2048, torch.empty(0, dtype=BF16), None) == {}  # cuBLAS's
    codes, scale = _weights(40, form, gen)
    x = torch.randn(4, K, generator=gen).bfloat16()
    kw = engine_launch(4, 40, K, codes, scale)
    assert kw == {"block_n": 16, "split": 1}
    want = dequant_gemv_ref(x, codes, scale)
    got = dequant_gemv_triton(x.to(device), codes.to(device), _to(scale, device), **kw)
    # fp32 sums of K products (an fp8 code times its scale rounds once more), a bf16 output
    assert rel_err(got, want) < bound(BF16, K + 1, roundings=CAST)


def test_accumulating_one_bf16_row_splits_k_where_n_is_short():
    """Into `out` a K split is free (no zero fill, no cast): the launch splits where N leaves
    SMs idle (the 35B-A3B's gdn_out and router, bench/results/h200-gemv-fusions.md) and
    where more loads in flight win (the 27B's)."""
    w = torch.empty(0, dtype=torch.bfloat16)
    assert engine_launch(1, 2048, 4096, w, None)["split"] == 1
    assert engine_launch(1, 2048, 4096, w, None, accumulate=True)["split"] == 2
    assert engine_launch(1, 257, 2048, w, None, accumulate=True)["split"] == 4
    assert engine_launch(1, 34816, 5120, w, None, accumulate=True)["split"] == 1
    # the 27B's gate|up and GDN in-projection: 32 rows a program, 128 K (h200-27b-gemv-split.md)
    for N in (34816, 16480):
        launch = engine_launch(1, N, 5120, w, None)
        assert (launch["block_n"], launch["block_k"], launch["split"]) == (32, 128, 1)
    assert engine_launch(1, 248320, 5120, w, None)["block_n"] == 16  # the head: unchanged
    assert engine_launch(1, 24576, 4096, w, None)["block_n"] == 16  # not measured at K 4096
    # the 27B's down and gdn_out (h200-gemv-splits.md): 256 K an iteration, two splits
    for K in (17408, 6144):
        launch = engine_launch(1, 5120, K, w, None, accumulate=True)
        assert (launch["block_k"], launch["split"]) == (256, 2)
    assert engine_launch(1, 16, 256, w, None, accumulate=True)["split"] == 1  # K < block_k


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_gated_kernel_rounds_as_the_torch_ops(device, act):
    """`gated_triton` (one launch, row-strided halves of a gate|up output) against `gated_ref`
    (two torch ops): equal on a GPU; the interpreter truncates bf16 casts, so close there."""
    from ninfer_engine.kernels.dequant_gemv_kernels import gated_triton

    gu = (torch.randn(3, 2 * 3000, generator=torch.Generator().manual_seed(2)) * 4).bfloat16()
    dev = gu.to(device)
    got = gated_triton(dev[:, 3000:], dev[:, :3000], act).cpu()
    want = gated_ref(gu[:, 3000:], gu[:, :3000], act)
    assert got.shape == want.shape and got.is_contiguous()
    if interpreting():
        # the act's exp, add and division in fp32, then two casts (act, product) each side
        assert rel_err(got, want) < bound(BF16, TRANSCENDENTAL + 2, roundings=2 * CAST)
    else:
        assert torch.equal(got, want)
