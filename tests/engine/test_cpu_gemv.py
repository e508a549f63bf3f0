"""The compiled CPU step's GEMV paths (`kernels/cpu_gemv.h`) against torch, for the SIMD build and
the portable one (`NINFER_PORTABLE_DOT`: the int8 quantization and block sums in plain C).

Integer parts are checked exactly (block sums against a torch int32 computation, activation
codes against torch's round-half-even of the same fp32 products); the float result against a
float64 reference with the fp32 accumulation bound γ_n · Σ|terms| (tests/tolerance.py).
"""
from __future__ import annotations

import ctypes

import pytest
import torch

from ninfer_engine.kernels import cpu_decode as kernel
from ninfer_engine.models.llama_cpu_step import Q8Matrix

from tests import tolerance

pytestmark = pytest.mark.skipif(kernel.cpu_decode_unavailable() is not None,
                                reason=f"{kernel.cpu_decode_unavailable()}")
BUILDS = {"simd": False, "portable": True}


def _lib(build: str) -> ctypes.CDLL:
    return kernel.compiled_library(BUILDS[build])


def _q8_matrix(n: int, k: int, gen: torch.Generator) -> Q8Matrix:
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half()
    return Q8Matrix(codes, scales)


def _quantize(lib, x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    q = torch.zeros(m, k, dtype=torch.int8)
    d = torch.zeros(m, k // 32)
    lib.ninfer_quantize_rows(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr())
    return q, d


@pytest.mark.parametrize("build", BUILDS)
def test_int8_block_sums_are_exact(build):
    """Each 32-code block's int8 x int8 sum equals torch's int32 sum, bit for bit, including
    the extremes maddubs must not saturate on: w = -128 (|w| = 128 as unsigned) against
    x = ±127 (activation codes are never -128), whose pairs reach 2 · 128 · 127 < 2^15."""
    gen = torch.Generator().manual_seed(0)
    blocks = 4096
    w = torch.randint(-128, 128, (blocks, 32), dtype=torch.int8, generator=gen)
    x = torch.randint(-127, 128, (blocks, 32), dtype=torch.int8, generator=gen)
    w[:4] = -128
    x[0], x[1], x[2] = 127, -127, torch.tensor([127, -127] * 16, dtype=torch.int8)
    w[4], x[4] = 127, 127
    out = torch.zeros(blocks, dtype=torch.int32)
    _lib(build).ninfer_q8_block_sums(w.data_ptr(), x.data_ptr(), blocks, out.data_ptr())
    want = (w.int() * x.int()).sum(1, dtype=torch.int32)
    assert torch.equal(out, want)
    assert want[0] == 32 * -128 * 127 and want[4] == 32 * 127 * 127


@pytest.mark.parametrize("build", BUILDS)
def test_activation_codes_round_half_even_like_torch(build):
    """quantize_rows: d = absmax / 127 and q = round_half_even(x · (127 / absmax)) per 32, the
    same fp32 operations torch does here, so codes and scales are equal exactly (an all-zero
    block gets d = 0 and zero codes)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 576, generator=gen) * torch.logspace(-3, 2, 576)
    x[1, :32] = 0
    x[2, 32:64] = torch.arange(32) - 15.5  # exact halves before scaling
    q, d = _quantize(_lib(build), x)
    blocks = x.view(3, -1, 32)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros(()))
    assert torch.equal(d, amax / 127)
    assert torch.equal(q.view(3, -1, 32), torch.round(blocks * inv[..., None]).to(torch.int8))


def test_the_portable_build_gives_the_simd_codes():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 1536, generator=gen)
    simd, portable = _quantize(_lib("simd"), x), _quantize(_lib("portable"), x)
    assert torch.equal(simd[0], portable[0]) and torch.equal(simd[1], portable[1])


def _project(lib, activations: str, x: torch.Tensor, w: Q8Matrix) -> torch.Tensor:
    m, k = x.shape
    n = w.codes.shape[0]
    tiled = w.tile_rows()
    y = torch.zeros(m, n)
    xq = torch.zeros(1, m, 2 * k, dtype=torch.int8)  # int16 codes fit
    xd = torch.zeros(1, m, k // 32)
    lib.ninfer_project(kernel.ACTIVATIONS.index(activations), 1, 1, x.data_ptr(), m, k,
                       tiled.codes.data_ptr(), tiled.scales.data_ptr(), y.data_ptr(), n,
                       xq.data_ptr(), xd.data_ptr())
    return y


def _rounded(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x quantized per 32 to ±levels as the kernel does (fp64 values of its codes x scales), and
    the half step of each element's block."""
    blocks = x.view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, levels / amax, torch.zeros(()))
    q = torch.round(blocks * inv)
    return (q.double() * (amax / levels).double()).view_as(x), (amax / levels / 2).expand_as(
        blocks).reshape_as(x).double()


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("activations", kernel.ACTIVATIONS)
@pytest.mark.parametrize("rows", [1, 3, 5])  # one input, a partial pass of 4, a full one and more
def test_gemv_against_the_float64_product(build, activations, rows):
    """y = x · Wᵀ over the stored values. The kernel's own error is fp32 accumulation: products
    of K terms (fp32 inputs; exact int32 block sums then G = K / 32 scaled adds for the
    quantized ones) summed in fp32, at most γ_{K+4} · Σ|terms| against the float64 product of
    what it multiplied (Higham Lemma 3.1; +4: the scale products and the 8-lane reduction).
    The quantized inputs add their own rounding, checked here against x itself: at most half
    a code step of the block's absmax per element (times |w|), plus 1 fp32 rounding of x · inv."""
    gen = torch.Generator().manual_seed(3)
    k, n = 576, 136
    w = _q8_matrix(n, k, gen)
    x = torch.randn(rows, k, generator=gen) * torch.logspace(-2, 1, k)
    got = _project(_lib(build), activations, x, w).double()
    W = w.dequantize().double()
    if activations == "fp32":
        used, half_step = x.double(), torch.zeros(rows, k, dtype=torch.float64)
    else:
        used, half_step = _rounded(x, 127 if activations == "int8" else 32767)
        half_step = half_step * (1 + 2 * tolerance.unit_roundoff(torch.float32))
    terms = used.abs() @ W.abs().T
    accumulation = tolerance.gamma(torch.float32, k + 4) * terms
    tolerance.assert_within(got, used @ W.T, accumulation)
    quantization = half_step @ W.abs().T
    tolerance.assert_within(got, x.double() @ W.T, accumulation + quantization)
    if activations != "fp32":  # the rounding is really there: int8 is ~1e-3 of the result
        assert (used - x.double()).abs().max() > 0
