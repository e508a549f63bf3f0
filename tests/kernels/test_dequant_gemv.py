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
