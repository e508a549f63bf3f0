import torch

from ninfer_engine.kernels.rotary import rope_ref, rope_triton

from .conftest import rel_err


def test_partial_rope_matches_reference(device):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 32, generator=g).to(device)
    pos = torch.tensor([0, 7, 40000]).to(device)
    y = rope_triton(x, pos, 8, 1e7)
    ref = rope_ref(x, pos, 8, 1e7)
    assert rel_err(y, ref) < 1e-5
    assert torch.equal(y[..., 8:].cpu(), x[..., 8:].cpu())  # the unrotated dims pass through
