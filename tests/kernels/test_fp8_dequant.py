"""The Triton fp8 weight dequantisation against its torch path."""

import pytest
import torch

from ninfer_engine.kernels.fp8_dequant import fp8_dequant, fp8_dequant_ref


def _codes(n, k, gen):
    w = torch.randn(n, k, generator=gen) * 100
    w[0, :4] = torch.tensor([448.0, -448.0, 2.0**-9, -(2.0**-7)])  # extremes and subnormals
    return w.clamp(-448, 448).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("n, k, group", [(5, 96, 0), (33, 1024, 0), (7, 256, 32), (20, 640, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequant_matches_torch(device, n, k, group, dtype):
    gen = torch.Generator().manual_seed(n + k)
    codes = _codes(n, k, gen)
    shape = (n,) if group == 0 else (n, k // group)
    scale = (torch.rand(shape, generator=gen) + 0.01).to(torch.bfloat16)
    want = fp8_dequant_ref(codes, scale, dtype)
    got = fp8_dequant(codes.to(device), scale.to(device), dtype)
    assert got.dtype == dtype and torch.equal(got.cpu(), want)


def test_dequant_into_a_row_block(device):
    # mixed-format matrices dequantise each block into its rows of one output
    gen = torch.Generator().manual_seed(1)
    codes, scale = _codes(6, 128, gen), torch.rand(6, generator=gen) + 0.1
    out = torch.zeros(10, 128, dtype=torch.bfloat16, device=device)
    fp8_dequant(codes.to(device), scale.to(device), torch.bfloat16, out=out[2:8])
    assert torch.equal(out[2:8].cpu(), fp8_dequant_ref(codes, scale, torch.bfloat16))
    assert not out[:2].any() and not out[8:].any()
