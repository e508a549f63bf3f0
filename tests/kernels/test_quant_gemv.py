import pytest
import torch

from ninfer_engine.codecs import encodings
from ninfer_engine.codecs import planes as stored
from ninfer_engine.kernels import quant_gemv as qg

from tests.tolerance import bound

from .conftest import gemv_tol, rel_err

# two decodes of the same codes: E2M1 × e4m3 block scale × the tensor scale d_w (or 1 / d_w,
# one more rounding), fp32 products in any order, each side
DECODE = bound(torch.float32, 3)

ROWSPLIT = {"q4": ("q4_g64_fp16", 4, 64), "q5": ("q5_g64_fp16", 5, 64),
            "q6": ("q6_g64_fp16", 6, 64), "q8": ("q8_g32_fp16", 8, 32)}
FORMATS = [*ROWSPLIT, "nvfp4"]


def _weights(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w[0, :7] *= 9.0  # a few outliers: groups with very different scales
    return w


def _quantized(fmt, n, k, device="cpu", seed=0):
    """(planes, dequant_ref, fp32 decode of the same bytes by the artifact codec)."""
    w = _weights(n, k, seed)
    if fmt == "nvfp4":
        codes, scale, d_w = stored.quantize_nvfp4(w)
        planes = (codes.to(device), scale.to(device), d_w)
        return planes, qg.nvfp4_dequant_ref(codes, scale, d_w)
    name, bits, group = ROWSPLIT[fmt]
    base, high, scale = stored.quantize_rowsplit(w, name)
    planes = (base.to(device), high.to(device), scale.to(device), bits, group, k)
    return planes, qg.rowsplit_dequant_ref(base, high, scale, bits, group, k)


def _gemv(fmt, x, planes, **kw):
    if fmt == "nvfp4":
        return qg.nvfp4_gemv_triton(x, *planes, **kw)
    return qg.rowsplit_gemv_triton(x, *planes, **kw)


@pytest.mark.parametrize("fmt", list(ROWSPLIT))
@pytest.mark.parametrize("shape", [(5, 192), (64, 128), (3, 300)])
def test_rowsplit_planes_match_codec(fmt, shape):
    name, bits, group = ROWSPLIT[fmt]
    w = _weights(*shape, seed=1)
    raw = encodings.encode(name, w)
    base, high, scale = stored.rowsplit_planes(raw, name, shape)
    assert high.shape[1] == scale.shape[1] * {4: 0, 5: 8, 6: 16, 8: 0}[bits]
    decoded = encodings.decode(name, raw, shape)
    assert torch.equal(qg.rowsplit_dequant_ref(base, high, scale, bits, group, shape[1]), decoded)
    r0, r1 = 1, shape[0] - 1  # row slices of the planes are the planes of the row range
    part = qg.rowsplit_dequant_ref(base[r0:r1], high[r0:r1], scale[r0:r1], bits, group, shape[1])
    assert torch.equal(part, encodings.decode(name, raw, shape, rows=(r0, r1)))
    # the device-agnostic quantiser gives the encoder's planes, bit for bit
    for mine, file in zip(stored.quantize_rowsplit(w, name), (base, high, scale)):
        assert mine.shape == file.shape and torch.equal(mine, file)


@pytest.mark.parametrize("shape", [(128, 64), (256, 128)])
def test_nvfp4_planes_match_codec(shape):
    w = _weights(*shape, seed=2)
    raw = encodings.encode("nvfp4", w)
    codes, scale, d_w = stored.nvfp4_planes(raw, shape)
    assert codes.shape == (shape[0], shape[1] // 2) and scale.shape == (shape[0], shape[1] // 16)
    decoded = encodings.decode("nvfp4", raw, shape)
    torch.testing.assert_close(qg.nvfp4_dequant_ref(codes, scale, d_w), decoded, rtol=DECODE,
                               atol=0)
    r0, r1 = 3, shape[0] - 5
    part = qg.nvfp4_dequant_ref(codes[r0:r1], scale[r0:r1], d_w)
    torch.testing.assert_close(part, encodings.decode("nvfp4", raw, shape, rows=(r0, r1)),
                               rtol=DECODE, atol=0)
    mine = stored.quantize_nvfp4(w, rows_per_chunk=96)  # chunks that cut a 128-row tile
    assert torch.equal(mine[0], codes) and torch.equal(mine[1], scale) and mine[2] == d_w


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(5, 192), (64, 128)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dot", [False, True])
def test_gemv_matches_reference(device, fmt, shape, batch, dot):
    n, k = shape
    if fmt == "nvfp4":
        k = 64 if n == 5 else 128
    planes, w = _quantized(fmt, n, k, device)
    x = torch.randn(batch, k, generator=torch.Generator().manual_seed(3)).bfloat16()
    ref = x.float() @ w.t()
    out = _gemv(fmt, x.to(device), planes, dot=dot, block_n=16, block_kw=8)
    assert out.shape == (batch, n) and out.dtype == torch.bfloat16
    assert rel_err(out, ref) < gemv_tol(k)


@pytest.mark.parametrize("fmt", ["q5", "q8", "nvfp4"])
@pytest.mark.parametrize("split", [1, 2])
def test_gemv_writes_into_column_slice(device, fmt, split):
    n, k = 5, 128
    planes, w = _quantized(fmt, n, k, device, seed=4)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(5)).bfloat16().to(device)
    buf = torch.zeros(2, n + 9, dtype=torch.bfloat16, device=device)
    view = buf[:, 4 : 4 + n]
    got = _gemv(fmt, x, planes, out=view, split=split, block_kw=4)
    assert got.data_ptr() == view.data_ptr()
    assert rel_err(view, x.float().cpu() @ w.t()) < gemv_tol(k)
    assert not buf[:, :4].any() and not buf[:, 4 + n :].any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_kernel_matches_reference(device, fmt):
    planes, w = _quantized(fmt, 37, 64 if fmt == "nvfp4" else 192, device, seed=6)
    fn = qg.nvfp4_dequant if fmt == "nvfp4" else qg.rowsplit_dequant
    out32 = fn(*planes, dtype=torch.float32, kernel=True, block_n=16, block_kw=8).cpu()
    torch.testing.assert_close(out32, w, rtol=DECODE, atol=0)  # nvfp4: d_w as a reciprocal
    out = fn(*planes, kernel=True, block_n=16, block_kw=8).cpu()
    assert out.dtype == torch.bfloat16 and torch.equal(out, out32.bfloat16())  # RNE


@pytest.mark.parametrize("fmt", ["q6", "nvfp4"])
def test_cpu_dispatch_takes_reference(fmt):
    planes, w = _quantized(fmt, 5, 128, seed=7)
    x = torch.randn(1, 128).bfloat16()
    buf = torch.zeros(1, 12, dtype=torch.bfloat16)
    fn = qg.nvfp4_gemv if fmt == "nvfp4" else qg.rowsplit_gemv
    fn(x, *planes, out=buf[:, 2:7])
    assert torch.equal(buf[:, 2:7], (x.float() @ w.t()).bfloat16())
    deq = qg.nvfp4_dequant if fmt == "nvfp4" else qg.rowsplit_dequant
    assert torch.equal(deq(*planes), w.bfloat16())
