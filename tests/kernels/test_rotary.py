import pytest
import torch

from ninfer_engine.kernels.rotary import rope_ref, rope_triton

from tests.tolerance import TRANSCENDENTAL, bound

from .conftest import rel_err

# fp32 both sides: the angle pos × inv_freq is the same rounding on both (one IEEE product of
# the same operands), then cos and sin, two products and a sum
TOL = bound(torch.float32, TRANSCENDENTAL + 3)


def test_partial_rope_matches_reference(device):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 32, generator=g).to(device)
    pos = torch.tensor([0, 7, 40000]).to(device)
    y = rope_triton(x, pos, 8, 1e7)
    ref = rope_ref(x, pos, 8, 1e7)
    assert rel_err(y, ref) < TOL
    assert torch.equal(y[..., 8:].cpu(), x[..., 8:].cpu())  # the unrotated dims pass through


@pytest.mark.parametrize("D, rd", [(16, 4), (16, 16), (32, 8), (64, 16), (64, 64)])
def test_rope_at_small_head_dims(device, D, rd):
    # the decoder's call: one token, [1, heads, D], rd = D/4 (partial) or D
    g = torch.Generator().manual_seed(12)
    x = torch.randn(1, 4, D, generator=g).to(device)
    pos = torch.tensor([37]).to(device)
    y = rope_triton(x, pos, rd, 1e7)
    assert rel_err(y, rope_ref(x, pos, rd, 1e7)) < TOL
    assert torch.equal(y[..., rd:].cpu(), x[..., rd:].cpu())
