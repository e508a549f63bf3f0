"""The Triton GDN chunk precompute against `models.gdn.chunk_prep`, output by output."""

import math

import pytest
import torch

from ninfer_engine.kernels.gdn_chunk import chunk_gated_delta
from ninfer_engine.kernels.gdn_prep import chunk_prep_triton
from ninfer_engine.kernels.gdn_ref import chunk_prep, chunked_gated_delta, l2_normalize

from tests.tolerance import (assert_within, bound, cast_roundings, gated_delta_depth,
                             unit_roundoff)

from .conftest import rel_err

NAMES = ("w", "u", "qd", "ke", "p", "cd")


def _inputs(T, nk, nv, dk, dv, seed=0, g=None):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(T, nk, dk, generator=gen))
    k = l2_normalize(torch.randn(T, nk, dk, generator=gen))
    v = torch.randn(T, nv, dv, generator=gen)
    gates = -torch.rand(T, nv, generator=gen) if g is None else g(T, nv, gen)
    beta = torch.rand(T, nv, generator=gen)
    return q, k, v, gates, beta


def _expanded(q, k, nv):
    r = nv // q.shape[1]
    return q.repeat_interleave(r, 1), k.repeat_interleave(r, 1)


def _solve_condition(k, g, beta, chunk):
    """Skeel's condition number ‖|T⁻¹|·|T|‖∞ of the chunks' unit lower triangular
    T = I + tril(β·k·kᵀ ⊙ e^{γᵢ−γⱼ}, −1), in fp64: the triangular solve's forward error is
    γ_C times it (Higham Thm 8.5)."""
    T, nv = g.shape[0], g.shape[1]
    k = k.double().repeat_interleave(nv // k.shape[1], 1)
    worst = 1.0
    for c in range(0, T, chunk):
        kc, gc, bc = k[c: c + chunk], g[c: c + chunk].double(), beta[c: c + chunk].double()
        gam = gc.cumsum(0)  # [C, nv]
        decay = (gam[:, None] - gam[None, :]).clamp(max=0).exp()  # [C, C, nv]
        a = torch.einsum("ihd,jhd->hij", kc * bc[..., None], kc) * decay.permute(2, 0, 1)
        t = a.tril(-1) + torch.eye(len(kc), dtype=torch.float64)
        skeel = (t.inverse().abs() @ t.abs()).abs().sum(-1).amax()
        worst = max(worst, skeel.item())
    return worst


def _check_prep(args, device, chunk):
    q, k, v, g, beta = args
    # fp32 both sides: one chunk's prep, with the solve's error scaled by its condition number
    cond = _solve_condition(k, g, beta, chunk)
    depth = gated_delta_depth(torch.full((1, 1), -math.inf), k.shape[-1], chunk)
    tol = bound(torch.float32, depth + (cond - 1) * chunk)
    want, n_ref = chunk_prep(*_expanded(q, k, v.shape[1]), v, g, beta, chunk)
    got, n = chunk_prep_triton(*[t.to(device) for t in args], chunk)
    assert n == n_ref
    for name, a, b in zip(NAMES, got, want):
        assert a.shape == b.shape, name
        if not b.any():  # e.g. a chunk's decay e^{γ_C} underflowing to 0
            assert not a.cpu().any(), name
            continue
        assert rel_err(a, b) < tol, (name, rel_err(a, b))


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("T", [1, 40, 64, 130])
def test_prep_matches_torch(device, T, chunk):
    _check_prep(_inputs(T, 2, 2, 32, 16, seed=T), device, chunk)


@pytest.mark.parametrize("nk, nv, dk, dv", [(1, 3, 24, 40), (2, 4, 16, 32)])
def test_prep_grouped_heads_and_masked_dims(device, nk, nv, dk, dv):
    # value head j reads q/k head j // (nv / nk); dk = 24 / dv = 40 are padded to 32 / 64
    _check_prep(_inputs(70, nk, nv, dk, dv, seed=1), device, 16)


def test_prep_decay_after_a_large_cumulative_gate(device):
    # a fast-decaying start pushes γ to ~-600, then slow gates: the later in-chunk decays
    # e^{γ_i − γ_j} ≈ 1 must come from segment sums, not from differences of two large γ
    def gates(T, nv, gen):
        g = -0.01 * torch.rand(T, nv, generator=gen)
        g[:8] = -75.0
        return g

    _check_prep(_inputs(64, 1, 2, 16, 16, seed=2, g=gates), device, 64)


def test_prep_repeated_keys(device):
    # identical keys and β ≈ 1 make (I + A) all ones below the diagonal: its inverse is bounded,
    # its powers are not (a series expansion would fail here)
    q, k, v, g, beta = _inputs(64, 1, 1, 16, 16, seed=3, g=lambda T, nv, gen: torch.zeros(T, nv))
    k = k[:1].expand_as(k).contiguous()
    _check_prep((q, k, v, g, torch.full_like(beta, 0.999)), device, 64)


def test_chunk_rule_reads_grouped_heads(device):
    # the full Triton rule with nk < nv against the torch rule on expanded q / k
    q, k, v, g, beta = _inputs(100, 2, 4, 16, 16, seed=4)
    state = torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(5))
    ref_o, ref_s = chunked_gated_delta(*_expanded(q, k, 4), v, g, beta, state, chunk=16)
    o, s = chunk_gated_delta(*[t.to(device) for t in (q, k, v, g, beta, state)], chunk=16)
    tol = bound(torch.float32, gated_delta_depth(g, 16, 16))  # fp32 chunked chain, both sides
    assert rel_err(o, ref_o) < tol and rel_err(s, ref_s) < tol


def test_prep_stores_bf16_tiles_rounded_once(device):
    # `tiles_dtype=torch.bfloat16`: each of w, u, qd, ke, p is the fp32 launch's value rounded
    # once to bf16 (to nearest on a GPU; the interpreter truncates: one ulp), cd unchanged
    args = [t.to(device) for t in _inputs(130, 2, 4, 32, 32, seed=6)]
    want, n = chunk_prep_triton(*args, 64)
    got, n_bf16 = chunk_prep_triton(*args, 64, tiles_dtype=torch.bfloat16)
    assert n_bf16 == n
    ulp = cast_roundings() * unit_roundoff(torch.bfloat16)
    for name, g, w in zip(NAMES, got, want):
        if name == "cd":
            assert g.dtype == torch.float32 and torch.equal(g, w)
            continue
        assert g.dtype == torch.bfloat16, name
        # below bf16's smallest normal its spacing is absolute
        assert_within(g, w, ulp * w.double().abs().cpu() + torch.finfo(torch.bfloat16).tiny)
