import pytest
import torch

from ninfer_engine.kernels.dequant_gemv import (
    dequant_gemv_ref,
    dequant_gemv_triton,
    quantize_fp8_row,
    quantize_q8_g32,
)

from .conftest import rel_err


@pytest.mark.parametrize("encoding", ["fp8_row", "q8_g32"])
@pytest.mark.parametrize("batch", [1, 5])
def test_dequant_gemv_matches_reference(device, encoding, batch):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(48, 256, generator=g)
    x = torch.randn(batch, 256, generator=g).bfloat16()
    codes, scale = (quantize_fp8_row if encoding == "fp8_row" else quantize_q8_g32)(w)
    ref = dequant_gemv_ref(x, codes, scale)
    out = dequant_gemv_triton(x.to(device), codes.to(device), scale.to(device),
                              block_n=32, block_k=64)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("encoding", ["fp8_row", "q8_g32"])
@pytest.mark.parametrize("K", [64, 96, 160])
def test_dequant_gemv_default_tile_at_small_k(device, encoding, K):
    # tiny-dense's MLP down projection has K = 96: the tile must stay a power of two
    g = torch.Generator().manual_seed(15)
    w = torch.randn(40, K, generator=g)
    x = torch.randn(1, K, generator=g).bfloat16()
    codes, scale = (quantize_fp8_row if encoding == "fp8_row" else quantize_q8_g32)(w)
    out = dequant_gemv_triton(x.to(device), codes.to(device), scale.to(device))
    assert rel_err(out, dequant_gemv_ref(x, codes, scale)) < 1e-2
