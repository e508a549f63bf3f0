"""Kernel tests run the Triton path on CUDA, or on the CPU through TRITON_INTERPRET=1."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.kernels._dispatch import HAVE_TRITON, interpreting
from tests.tolerance import CAST, TRANSCENDENTAL, bound, gamma, gamma_of, unit_roundoff

F32 = torch.float32


@pytest.fixture
def device():
    if not HAVE_TRITON:
        pytest.skip("Triton is not installed")
    if torch.cuda.is_available():
        return "cuda"
    if interpreting():
        return "cpu"
    pytest.skip("needs CUDA or TRITON_INTERPRET=1")


def compile_in_child(script: str, *args: str) -> str:
    """Runs `script` (a Triton compile for the GPU, no GPU needed) in a child process, not
    under the interpreter this suite may run in (Triton's compiler checks what its interpreter
    does not); asserts it succeeded and returns what it printed."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rel_err(out, ref):
    """‖out − ref‖ / ‖ref‖ in fp64."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


SILU_SLOPE = 1.1  # max |SiLU'(g)| = 1.0998: SiLU passes an absolute error of g on at most ×1.1


def gate_up_exact(x, w, ids, acc_unit=None):
    """(SiLU(g)·u in fp64, the fp32 accumulation error bound of computing it): g and u are
    length-H dots, each off by ≤ γ_H·Σ|xᵢwᵢ| (`tests.tolerance`; `acc_unit`: the dots'
    accumulator is coarser than fp32's); SiLU (an exp, an add, a division) and the product add
    their roundings relative to |SiLU(g)·u|. `w` [S, 2I, H]."""
    S, H = w.shape[0], w.shape[-1]
    xs = x.double().repeat_interleave(S // x.shape[0], 0)
    g, u = torch.einsum("sk,snk->sn", xs, w).chunk(2, -1)
    ag, au = torch.einsum("sk,snk->sn", xs.abs(), w.abs()).chunk(2, -1)
    exact = F.silu(g) * u
    dots = gamma_of(acc_unit or unit_roundoff(F32), H)
    noise = (dots * (SILU_SLOPE * u.abs() * ag + F.silu(g).abs() * au)
             + gamma(F32, TRANSCENDENTAL + 3) * exact.abs())
    return exact, noise


def down_exact(act, w, weights, B, k, acc_unit=None):
    """(Σ_slots weight · (act @ w) in fp64 as [B, k, H] per-slot terms, the fp32 accumulation
    error bound of their sum): each slot's length-I dot, its weight product and the k-slot sum
    count I + 1 + k roundings relative to Σ_slots |weight|·Σ|actᵢwᵢ|. `w` [S, H, I]."""
    I = w.shape[-1]
    down = torch.einsum("sk,snk->sn", act.double(), w).view(B, k, -1)
    absolute = torch.einsum("sk,snk->sn", act.double().abs(), w.abs()).view(B, k, -1)
    weights = weights.double()[..., None]
    chain = gamma_of(acc_unit or unit_roundoff(F32), I + 1 + k)
    return down * weights, chain * (absolute * weights.abs()).sum(1)


def attention_tol(q, keys, context, splits=1):
    """rel_err bound of a paged attention kernel against its fp32 reference over the same
    decoded K/V (`tests.tolerance`). fp32 chain: the length-D scores, whose absolute error
    γ_D·‖q‖·‖k‖/√D is a relative error of e^s (so D counts that many times), the exp, the
    context-term softmax sum and P·V, the division, and per 64-token page the online
    rescale's exp and multiply. bf16 queries: the interpreter's dots are fp32 and only the
    output is cast (CAST roundings); a GPU's dots take bf16 operands: K, V and P are rounded
    to nearest, then the output (4). The reference rounds its output once. A merge of
    `splits` partial softmaxes adds, per split, its weight's exp, the product and the sum."""
    D = q.shape[-1]
    norm = keys.double().nan_to_num(0.0).norm(dim=-1).max() * q.double().norm(dim=-1).max()
    pages = -(-context // 64)
    depth = (D * max(1.0, norm.item() / D ** 0.5) + 2 * context + TRANSCENDENTAL * (pages + 1)
             + (TRANSCENDENTAL + 2) * (splits - 1) + 3)
    if q.dtype == torch.float32:
        return bound(F32, depth)
    return bound(q.dtype, depth, roundings=CAST if interpreting() else 4)


def softmax_depth(logits, k):
    """Roundings of one top-k softmax weight, relative to itself: the shift l − max (1) and
    exp (an absolute error u·|l − max| in the argument is a relative error of the result, so
    the logits' span counts too), the E-term sum, the division, then the k-term renormalising
    sum and division."""
    span = (logits.float().amax(-1) - logits.float().amin(-1)).max().item()
    return 1 + span + TRANSCENDENTAL + logits.shape[-1] + 1 + k + 1


def gemv_tol(K, dtype=torch.bfloat16):
    """rel_err bound of a (dequant) GEMV against its fp32 reference: bf16 / fp16 activations
    and weights multiply exactly in fp32, a code × scale dequantization rounds once more (K + 1
    roundings along the fp32 chain). In `dtype`, 2 roundings a side: on a GPU the output cast
    and the dot path's dequantized weights cast to a bf16 operand, each to nearest; under the
    interpreter (fp32 dots) the output cast alone, which truncates (CAST = 2)."""
    return bound(dtype, K + 1, roundings=max(CAST, 2))
