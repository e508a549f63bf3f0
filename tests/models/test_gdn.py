"""Our gated delta rule (chunked and recurrent) against HF's module-level recurrent oracle."""

from __future__ import annotations

import pytest
import torch

from ninfer_engine.kernels.gdn_ref import (CHUNK, chunked_gated_delta, l2_normalize,
                                          recurrent_gated_delta)

from tests.tolerance import assert_within, bound, gated_delta_depth

oracle = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

NK, NV, DK, DV = 2, 4, 16, 8


def _inputs(T: int, seed: int = 0, decay_scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, NK, DK, generator=gen)
    k = torch.randn(T, NK, DK, generator=gen)
    v = torch.randn(T, NV, DV, generator=gen)
    # g = -exp(A_log)·softplus(·): a spread of slow and fast decays
    g = -torch.rand(T, NV, generator=gen) * torch.tensor([0.01, 0.1, 1.0, 5.0]) * decay_scale
    beta = torch.rand(T, NV, generator=gen)
    return q, k, v, g, beta


def _hf(q, k, v, g, beta):
    out, state = oracle.torch_recurrent_gated_delta_rule(
        q[None], k[None], v[None], g=g[None], beta=beta[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    return out[0], state[0]


def _assert_close(got, want, g, chunk):
    """fp32 both sides: HF's recurrent rule against ours, chunked (chunk C) or not; each
    within γ of its chain (`tests.tolerance.gated_delta_depth`) of the largest |value|."""
    tol = bound(torch.float32, gated_delta_depth(g, DK, chunk, normalize=True))
    assert_within(got, want, tol * want.abs().max())


def _ours(q, k, v, g, beta, device):
    """Our rule's inputs on `device`: l2-normalised q, k repeated to the value heads."""
    qn, kn = (l2_normalize(x.to(device)).repeat_interleave(NV // NK, 1) for x in (q, k))
    return qn, kn, v.to(device), g.to(device), beta.to(device)


@pytest.mark.parametrize("splits", [[64, 64, 72], [1, 63, 130, 6], [37, 1, 1, 161]])
def test_chunked_over_several_calls_matches_hf_recurrent(splits, device):
    q, k, v, g, beta = _inputs(sum(splits))
    ref_out, ref_state = _hf(q, k, v, g, beta)
    qn, kn, v, g, beta = _ours(q, k, v, g, beta, device)
    state, outs, start = torch.zeros(NV, DK, DV, device=device), [], 0
    for n in splits:
        s = slice(start, start + n)
        rule = recurrent_gated_delta if n == 1 else chunked_gated_delta
        out, state = rule(qn[s], kn[s], v[s], g[s], beta[s], state)
        outs.append(out)
        start += n
    _assert_close(torch.cat(outs), ref_out, g.cpu(), CHUNK)
    _assert_close(state, ref_state, g.cpu(), CHUNK)


def test_recurrent_matches_hf_recurrent(device):
    q, k, v, g, beta = _inputs(40, seed=1)
    ref_out, ref_state = _hf(q, k, v, g, beta)
    out, state = recurrent_gated_delta(*_ours(q, k, v, g, beta, device),
                                       torch.zeros(NV, DK, DV, device=device))
    _assert_close(out, ref_out, g, 0)
    _assert_close(state, ref_state, g, 0)


def test_chunked_stays_accurate_under_strong_decay(device):
    # in-chunk cumulative decays reach ~-3000 here; pairwise decays must not cancel them
    q, k, v, g, beta = _inputs(1000, seed=2, decay_scale=20.0)
    ref_out, ref_state = _hf(q, k, v, g, beta)
    out, state = chunked_gated_delta(*_ours(q, k, v, g, beta, device),
                                     torch.zeros(NV, DK, DV, device=device))
    _assert_close(out, ref_out, g, CHUNK)
    _assert_close(state, ref_state, g, CHUNK)
