import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.kernels.dequant_gemv import (
    dequant_gemv,
    dequant_gemv_ref,
    kernel_tiles,
    quantize_fp8_row,
    quantize_q8_g32,
)
from ninfer_engine.kernels.dequant_gemv_kernels import dequant_gemv_triton

from .conftest import gemv_tol, rel_err


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
    assert rel_err(out, ref) < gemv_tol(256)


@pytest.mark.parametrize("encoding", ["fp8_row", "q8_g32"])
@pytest.mark.parametrize("K", [64, 96, 160])
def test_dequant_gemv_default_tile_at_small_k(device, encoding, K):
    # tiny-dense's MLP down projection has K = 96: the tile must stay a power of two
    g = torch.Generator().manual_seed(15)
    w = torch.randn(40, K, generator=g)
    x = torch.randn(1, K, generator=g).bfloat16()
    codes, scale = (quantize_fp8_row if encoding == "fp8_row" else quantize_q8_g32)(w)
    out = dequant_gemv_triton(x.to(device), codes.to(device), scale.to(device))
    assert rel_err(out, dequant_gemv_ref(x, codes, scale)) < gemv_tol(K)


# plain bf16/fp16 weights (scale None): the fma path at one row, the dot path at three; K = 128
# in tiles of 32, so splits of 2 and 4, summed by torch or by atomics
PLAIN_CASES = [(1, dict(fma=True)), (1, dict(fma=True, split=1)),
               (1, dict(fma=True, split=4, atomic=True)), (1, dict(fma=True, split=2)),
               (3, {}), (3, dict(split=1)), (3, dict(split=2, atomic=True)),
               (3, dict(split=4))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch, kw", PLAIN_CASES)
def test_plain_weights_match_f_linear(device, dtype, batch, kw):
    gen = torch.Generator().manual_seed(21 + batch)
    n, k = 45, 128  # odd N: a partial last row block
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    x = torch.randn(batch, k, generator=gen).to(dtype)
    out = dequant_gemv_triton(x.to(device), w.to(device), None, block_n=32, block_k=32, **kw)
    assert out.dtype == dtype and out.shape == (batch, n)
    out = out.float().cpu()
    ref = F.linear(x.float(), w.float())  # exact products, fp32 sums
    # the final rounding to x's dtype (2^-7 relative: the interpreter truncates bf16) plus the
    # fp32 summation order
    rounding = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    bound = rounding * ref.abs() + 2.0**-16 * (x.float().abs() @ w.float().abs().t())
    assert ((out - ref).abs() <= bound).all()
    assert rel_err(out, F.linear(x, w)) < gemv_tol(k, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch", [1, 3])
def test_plain_weights_pass_through_exactly(device, dtype, batch):
    # one-hot x rows pick single weight columns: every path returns them bit for bit
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(37, 64, generator=gen).to(dtype)
    hot = torch.tensor([5, 40, 63])[:batch]
    x = torch.zeros(batch, 64, dtype=dtype)
    x[torch.arange(batch), hot] = 1.0
    out = dequant_gemv_triton(x.to(device), w.to(device), None, block_n=32, block_k=32,
                              fma=batch == 1)
    assert torch.equal(out.cpu(), w[:, hot].t())


@pytest.mark.parametrize("encoding", ["fp8_row", "q8_g32", "plain"])
@pytest.mark.parametrize("K", [24, 40, 256])
def test_entry_point_takes_the_torch_path_where_the_kernel_cannot_tile(device, encoding, K):
    """K = 24 (a tiny model's MLP) has no power-of-two step of 16: the entry point must not
    hand it to the kernel, whose tile assertion would fail the engine (found on the H200)."""
    g = torch.Generator().manual_seed(K)
    w = torch.randn(40, K, generator=g)
    x = torch.randn(1, K, generator=g).bfloat16()
    if encoding == "plain":
        codes, scale = w.bfloat16(), None
    elif encoding == "q8_g32" and K % 32:
        pytest.skip("groups of 32 need K a multiple of 32")
    else:
        codes, scale = (quantize_fp8_row if encoding == "fp8_row" else quantize_q8_g32)(w)
    assert kernel_tiles(K, scale) == (K == 256)
    out = dequant_gemv(x.to(device), codes.to(device), None if scale is None else scale.to(device))
    assert rel_err(out, dequant_gemv_ref(x, codes, scale)) < gemv_tol(K)
