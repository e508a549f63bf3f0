import pytest
import torch

from ninfer_engine.kernels.rmsnorm import rms_norm_ref, rms_norm_triton

from tests.tolerance import CAST, TRANSCENDENTAL, bound

from .conftest import rel_err

BF16 = torch.bfloat16


def _tol(H):
    """bf16 out of an fp32 chain: the residual add, the H-term sum of squares, the mean, the
    rsqrt, the weight product (and its + 1); each side casts h and y once (the interpreter may
    truncate: CAST)."""
    return bound(BF16, 1 + H + 1 + TRANSCENDENTAL + 2, roundings=CAST)


@pytest.mark.parametrize("zero_centred", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(device, zero_centred, with_residual):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, generator=g).bfloat16().to(device)
    w = torch.randn(40, generator=g).to(device)
    res = torch.randn(3, 40, generator=g).bfloat16().to(device) if with_residual else None
    y, h = rms_norm_triton(x, w, 1e-6, res, zero_centred)
    y_ref, h_ref = rms_norm_ref(x, w, 1e-6, res, zero_centred)
    assert rel_err(y, y_ref) < _tol(40)
    # the interpreter may round fp32 -> bf16 differently from torch; a GPU matches exactly
    assert rel_err(h, h_ref) < _tol(40)


@pytest.mark.parametrize("rows, H", [(4, 16), (2, 32), (1, 64), (1, 24)])
def test_zero_centred_rms_norm_of_head_rows(device, rows, H):
    # q/k norms run over rows of one head dim; the block norms over the hidden size
    g = torch.Generator().manual_seed(11)
    x = torch.randn(rows, H, generator=g).bfloat16().to(device)
    w = (torch.randn(H, generator=g) * 0.1).bfloat16().to(device)
    y, h = rms_norm_triton(x, w, 1e-6, None, True)
    assert rel_err(y, rms_norm_ref(x, w, 1e-6, None, True)[0]) < _tol(H)
    assert torch.equal(h.cpu(), x.cpu())


def test_fp32_delta_beside_a_bf16_residual(device):
    """A projection's fp32 sums (`dequant_gemv`'s `out`) as x: added to the residual unrounded,
    h and y in the residual's dtype."""
    g = torch.Generator().manual_seed(4)
    delta = torch.randn(2, 48, generator=g).to(device)
    res = torch.randn(2, 48, generator=g).bfloat16().to(device)
    w = torch.randn(48, generator=g).to(device)
    y, h = rms_norm_triton(delta, w, 1e-6, res, True)
    y_ref, h_ref = rms_norm_ref(delta, w, 1e-6, res, True)
    assert y.dtype == h.dtype == torch.bfloat16 and h_ref.dtype == torch.bfloat16
    # h: one fp32 add, then one cast, against the exact sum
    assert rel_err(h, delta.double() + res.double()) < bound(BF16, 1, roundings=CAST, sides=1)
    assert rel_err(h, h_ref) < _tol(48) and rel_err(y, y_ref) < _tol(48)
