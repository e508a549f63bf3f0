"""Parity tolerances derived from the arithmetic, never from one run's error.

The error model (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2-3):

* one rounding to a float format moves a value by at most its unit roundoff
  `u = finfo(dtype).eps / 2` relative (2⁻²⁴ fp32, 2⁻⁸ bf16, 2⁻¹¹ fp16, 2⁻⁵³ fp64);
* a chain of n roundings (a length-K dot product or sum counts K, in any summation order: the
  reorderings of AVX2 / AVX-512 BLAS kernels, split-K GPU kernels and the interpreter are all
  covered) is off by at most `γ_n = n·u / (1 − n·u)` relative to the sum of the absolute terms
  Σ|aᵢbᵢ| (Higham Lemma 3.1, eq. 3.5). That is the worst case; independent rounding errors grow
  as √n·u (`probabilistic`), a bound that holds with probability ≥ 1 − 2·exp(−λ²/2) per value
  (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, Thm 3.1);
* errors add over the stages of a computation (layers, kernels): the depth is the sum of the
  stages' counts. A result stored in a narrow dtype but accumulated in fp32 counts one rounding
  in the narrow dtype per stored intermediate, plus its reductions' lengths in fp32;
* two implementations of the same function each carry their own error: their difference is
  bounded by the sum (`sides=2`), or one side when the other is exact (a float64 reference);
* a quantization codec (KV codecs, int8 / Q4 / fp8 weights) moves a value by up to half its
  code step (`code_step`, relative to the absmax of the vector or group it scales): the tests
  count it as one rounding of that unit. Two inputs that differ by rounding noise can round
  to neighbouring codes, one whole step apart, which no float tolerance downstream covers: a
  parity test then makes both sides read the same codes and checks each side's stored codes
  against its own input to half a step (tests/engine/test_decode_graphs.py).

A bound is relative to the magnitude of the terms. The tests normalise by the reference's
largest |value| (`max`) or its norm (`rel_err`): for their random, well-scaled inputs (and a
network whose RMSNorms renormalise every layer) Σ|aᵢbᵢ| / |Σaᵢbᵢ| is O(√n), the same factor by
which the worst case γ_n exceeds the typical √n·u, so γ_n relative to the result still holds.

Counting conventions (`depth` and `roundings` below):

* a correctly rounded op (+ − × ÷ √, a cast) counts 1; a fused multiply-add counts 1 too, so
  FMA contraction on a GPU only lowers the count;
* a cast to a narrower float counts `CAST` = 2: the Triton interpreter (TRITON_INTERPRET=1,
  kernels run through numpy in fp32, their dots fp32) truncates (up to one ulp, 2u), a GPU and
  torch round to nearest (u); `cast_roundings()` picks by where the kernels run;
* exp, log, sin, cos, rsqrt, sigmoid count `TRANSCENDENTAL` = 4: within 2 ulp in CUDA's
  libdevice (CUDA Programming Guide, "Mathematical Functions"), glibc, SLEEF and numpy;
* a reduction of length K counts K (a dot product, a sum, a norm's sum of squares).
"""
from __future__ import annotations

import math
import os

import torch

ACCUMULATOR = torch.float32  # what GEMMs, GEMVs, Triton dots and norms accumulate narrow inputs in
CAST = 2  # roundings of one cast to a narrower float (the interpreter truncates: one ulp)
TRANSCENDENTAL = 4  # roundings of one exp / log / sin / cos / rsqrt / sigmoid (≤ 2 ulp)


def cast_roundings() -> int:
    """Roundings one cast to a narrower float counts here: CAST under the Triton interpreter
    (TRITON_INTERPRET=1, whose casts truncate), 1 where kernels run on a GPU (to nearest)."""
    return CAST if os.environ.get("TRITON_INTERPRET", "0") == "1" else 1


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: half the machine epsilon, the largest relative error of one rounding to `dtype`."""
    return torch.finfo(dtype).eps / 2


def gamma(dtype: torch.dtype, n: float) -> float:
    """Worst-case relative error of n roundings in `dtype`: γ_n = n·u / (1 − n·u)."""
    return gamma_of(unit_roundoff(dtype), n)


def gamma_of(u: float, n: float) -> float:
    """γ_n for a unit roundoff `u` that is no dtype's (an accumulator coarser than fp32)."""
    nu = n * u
    assert nu < 1, f"{n} roundings of unit {u:.3g} bound nothing: compare against float64"
    return nu / (1 - nu)


# e4m3 (3 mantissa bits): half a code step is 2⁻⁴ of |x| in the normal binades [2⁻⁶, 448] and
# 2⁻¹⁰ (half the subnormal spacing 2⁻⁹) below them, both times the vector's scale
E4M3_HALF_STEP, E4M3_HALF_STEP_SUBNORMAL = 2.0 ** -4, 2.0 ** -10


def bound(dtype: torch.dtype, depth: float, *, roundings: float = 0, sides: int = 2,
          probabilistic: float | None = None) -> float:
    """Relative bound on |a − b| / max|b| for `sides` computations of the same values.

    `depth`: the summed reduction lengths along the longest chain of the computation
    (accumulated in `dtype`, or in fp32 when `dtype` is narrower). `roundings`: how many times
    that chain's intermediates are stored in `dtype` when it is narrower than fp32 (each output
    of an op: a GEMV result, a norm, an activation); ignored for fp32 / fp64, whose stores are
    inside `depth`. `probabilistic=λ` uses λ·√n·u instead of γ_n (each side independent).
    """
    acc = dtype if torch.finfo(dtype).bits >= 32 else ACCUMULATOR
    parts = [(acc, depth)]
    if acc is not dtype:
        parts.append((dtype, roundings))
    if probabilistic is None:
        one = sum(gamma(t, n) for t, n in parts)
    else:
        one = sum(probabilistic * math.sqrt(n) * unit_roundoff(t) for t, n in parts)
    return sides * one


# The coarsest code step of each KV codec (`ninfer_engine.codecs.kv`) as a fraction of the
# absmax of the vector it quantizes (the head vector, or a group of it):
CODE_STEP = {
    "bf16": 0.0,  # stores the activation dtype: no code step (its rounding is the model's)
    # symmetric int8 / int4: one step is the scale, fp16(absmax / 127 or 7), which rounds up by at
    # most 2⁻¹¹ relative
    "int8": (1 + 2 ** -11) / 127,
    "int4": (1 + 2 ** -11) / 7,
    # e4m3 scaled so the absmax maps to 448: the top binade [256, 448] is spaced by 32
    "fp8": 32 / 448,
    # E2M1 (0, .5, 1, 1.5, 2, 3, 4, 6) is spaced by 2 at the top, times the block scale
    # e4m3(block absmax / 6), which rounds up by at most 2⁻⁴ relative
    "nvfp4": 2 * (1 + 2 ** -4) / 6,
}


def code_step(codec: str) -> float:
    """One code step of `codec` relative to the absmax of the vector it quantized: the most
    two encodings of inputs equal up to rounding noise can differ by, per element."""
    return CODE_STEP[codec]


def assert_within(got: torch.Tensor, want: torch.Tensor, limit: torch.Tensor | float) -> None:
    """|got − want| ≤ limit elementwise, in fp64 on the CPU (limit: a tensor or a scalar)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    limit = torch.as_tensor(limit, dtype=torch.float64).cpu()
    err = (got - want).abs()
    assert (err <= limit).all(), f"worst error / bound: {(err / limit).max().item():.3g}"


def assert_rounded_once(out: torch.Tensor, exact: torch.Tensor, noise: torch.Tensor | float,
                        dtype: torch.dtype = torch.bfloat16) -> None:
    """`out` is the fp64 `exact` value, computed with at most `noise` (absolute, elementwise:
    e.g. `gamma(fp32, K) · Σ|aᵢbᵢ|`) of accumulation error, then rounded once to nearest in
    `dtype`: |out − exact| ≤ u·(|exact| + noise) + noise. A truncating cast or a second
    rounding moves values by up to 2u and breaks it."""
    noise = torch.as_tensor(noise, dtype=torch.float64).cpu()
    assert_within(out, exact, unit_roundoff(dtype) * (exact.double().cpu().abs() + noise) + noise)


def recurrence_length(log_decay: torch.Tensor) -> float:
    """Effective number of steps whose rounding errors a decaying recurrence carries.

    A state updated as S_t = e^{g_t}·M_t·S_{t−1} + (step t's terms), with ‖M_t‖ ≤ 1 (the gated
    delta rule's I − β·k·kᵀ for a unit k and β ∈ [0, 1]), carries the error made at step j
    into step t scaled by at most exp(g_{j+1} + … + g_t); the accumulated error is the step's
    error times max_t Σ_{j ≤ t} exp(Σ_{j<s≤t} g_s) ≤ T. `log_decay` [T, ...] holds the g_t ≤ 0.
    """
    carried = torch.zeros(log_decay.shape[1:], dtype=torch.float64)
    longest = 0.0
    for g in log_decay.double().cpu():
        carried = carried * g.exp() + 1
        longest = max(longest, carried.max().item())
    return longest


def gated_delta_depth(g: torch.Tensor, dk: int, chunk: int = 0, normalize: bool = False) -> float:
    """Roundings of the gated delta rule's output and state, relative to their magnitude.

    A token costs the decay (a multiply and an exp), the delta's length-dk dot, the β product
    and the rank-1 update, and the output's length-dk dot: 2·dk + TRANSCENDENTAL + 5; l2
    normalising q and k adds a length-dk sum of squares and an rsqrt. That error is carried
    over `recurrence_length(g)` tokens. A chunked rule (`chunk` C > 0) also makes, per chunk it
    carries, the unit-triangular solve and the C-term products (w S, p v', keᵀv': 4C + 2·dk),
    and exps of C-term cumulative gates, whose absolute error C·u·|γ| is relative in e^γ; only
    |γ| ≤ ln(1/u) counts, e^γ being negligible beyond. g: [T, heads] log decays."""
    token = 2 * dk + TRANSCENDENTAL + 5 + (dk + TRANSCENDENTAL if normalize else 0)
    steps = recurrence_length(g)
    depth = steps * token
    if chunk:
        exp_arg = chunk * -math.log(unit_roundoff(torch.float32))
        depth += (steps / chunk + 1) * (4 * chunk + 2 * dk + TRANSCENDENTAL + exp_arg)
    return depth
