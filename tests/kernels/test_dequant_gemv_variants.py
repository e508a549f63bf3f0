"""The dequant GEMV's kernel variants (fma, atomic, group_k, split) against the torch reference,
on codes that cover every finite e4m3 value (subnormals, ±448) or every int8 value, at B in
{1, 3, 16} and odd N."""

import pytest
import torch

from ninfer_engine.kernels._dispatch import interpreting
from ninfer_engine.kernels.dequant_gemv import (
    dequant_gemv_ref,
    dequantize,
    engine_launch,
)
from ninfer_engine.kernels.dequant_gemv_kernels import dequant_gemv_triton

from .conftest import gemv_tol, rel_err

K = 64
VARIANTS = {
    "base": {},
    "fma": dict(fma=True),
    "atomic_split2": dict(atomic=True, split=2),
    "fma_atomic_split2": dict(fma=True, atomic=True, split=2),
    "group_k64": dict(group_k=64),
    "group_k64_fma": dict(group_k=64, fma=True),
}
ENCODINGS = ["fp8_row", "fp8_g32", "int8_g32", "fp8_g16"]


def _skip_if_not_applicable(variant, encoding, batch):
    kw = VARIANTS[variant]
    if kw.get("fma") and batch != 1:
        pytest.skip("fma is the batch-1 variant")
    if "group_k" in kw and encoding == "fp8_row":
        pytest.skip("group_k is for group-scaled weights")
    if encoding.startswith("int8") and ({"atomic", "group_k"} & set(kw)):
        pytest.skip("int8 decodes as e4m3 does on every path: base and fma cover it")


def _codes(n, encoding, gen):
    """Random codes over every finite e4m3 value (both zeros, subnormals, ±448) or every int8."""
    raw = torch.randint(0, 256, (n, K), generator=gen, dtype=torch.uint8)
    if encoding.startswith("int8"):
        return raw.view(torch.int8)
    raw[(raw & 0x7F) == 0x7F] &= 0xFE  # the NaN codes -> ±448 (0x7E / 0xFE)
    return raw.view(torch.float8_e4m3fn)


def _scale(n, encoding, gen, pow2=False):
    """Row scales (bf16) or group scales (fp16) over a few binades; powers of two if `pow2`."""
    if encoding == "fp8_row":
        shape, dtype = (n,), torch.bfloat16
    else:
        shape, dtype = (n, K // int(encoding.split("_g")[1])), torch.float16
    mant = 1 if pow2 else 1 + torch.rand(shape, generator=gen)
    return (mant * torch.exp2(torch.randint(-10, -2, shape, generator=gen).float())).to(dtype)


def _bound(x, w, ref):
    """|kernel − fp32 reference| allowed elementwise: the rounding to bf16 (round to nearest on
    GPUs, 2^-8 relative; the 3.9 interpreter truncates fp32 -> bf16 stores, 2^-7) plus fp32
    summation-order error."""
    rounding = 2.0**-7 if interpreting() else 2.0**-8
    return rounding * ref.abs() + 2.0**-16 * (x.float().abs() @ w.abs().t())


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_decodes_every_code_exactly(device, variant, encoding):
    # one-hot x rows pick single columns, so each output is one code times its power-of-two
    # scale: exact in fp32 and in bf16, on every path; the picked columns hold all 256 codes
    batch = 1 if VARIANTS[variant].get("fma") else 16
    _skip_if_not_applicable(variant, encoding, batch)
    gen = torch.Generator().manual_seed(3)
    n = 256 if batch == 1 else 48
    codes = _codes(n, encoding, gen).view(torch.uint8)
    hot = torch.arange(batch) * (K // batch) + 1
    every = torch.arange(n * batch, dtype=torch.int64) % 256
    codes[:, hot] = every.view(n, batch).to(torch.uint8)
    if not encoding.startswith("int8"):
        codes[(codes & 0x7F) == 0x7F] &= 0xFE
    codes = codes.view(torch.int8 if encoding.startswith("int8") else torch.float8_e4m3fn)
    scale = _scale(n, encoding, gen, pow2=True)
    x = torch.zeros(batch, K, dtype=torch.bfloat16)
    x[torch.arange(batch), hot] = 1.0
    ref = dequant_gemv_ref(x, codes, scale)
    out = dequant_gemv_triton(x.to(device), codes.to(device), scale.to(device),
                              block_n=128 if batch == 1 else 32, block_k=32, **VARIANTS[variant])
    assert out.dtype == x.dtype and out.shape == ref.shape
    assert torch.equal(out.cpu(), ref)


@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("encoding", ENCODINGS[:3])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_reference(device, variant, encoding, batch):
    _skip_if_not_applicable(variant, encoding, batch)
    gen = torch.Generator().manual_seed(11 + batch)
    n = {1: 45, 3: 17, 16: 33}[batch]  # odd N: a partial last row block
    codes, scale = _codes(n, encoding, gen), _scale(n, encoding, gen)
    x = (torch.randn(batch, K, generator=gen) * 4).bfloat16()
    w = dequantize(codes, scale)
    ref = x.float() @ w.t()
    out = dequant_gemv_triton(x.to(device), codes.to(device), scale.to(device),
                              block_n=32, block_k=32, **VARIANTS[variant]).float().cpu()
    # every product is exact (bf16 x, e4m3/int8 codes): only the fp32 summation order and the
    # final bf16 rounding differ from the reference
    assert ((out - ref).abs() <= _bound(x, w, ref)).all()


def test_variant_argument_checks(device):
    x = torch.ones(2, K, dtype=torch.bfloat16, device=device)
    codes = torch.zeros(8, K, dtype=torch.int8, device=device)
    scale = torch.ones(8, K // 32, dtype=torch.float16, device=device)
    with pytest.raises(ValueError):
        dequant_gemv_triton(x, codes, scale, fma=True)  # B = 2
    with pytest.raises(ValueError):
        dequant_gemv_triton(x, codes, scale, group_k=48)  # not a multiple of 32
    with pytest.raises(ValueError):
        dequant_gemv_triton(x, codes, None)  # plain weights are bf16/fp16
    with pytest.raises(ValueError):
        dequant_gemv_triton(x, codes.half(), None)  # plain weights in x's dtype


@pytest.mark.parametrize("n, k, batch",
                         [(40, 256, 1), (300, 512, 1), (40, 256, 3), (6144, 256, 1)])
@pytest.mark.parametrize("group", [0, 64])
def test_engine_launch_matches_reference(device, n, k, batch, group):
    """`dequant_gemv` as the engine calls it (`engine_launch`: the fma variant with an atomic K
    split for one row and few blocks, plain for many; wider group loops for several rows)."""
    gen = torch.Generator().manual_seed(n + k + batch + group)
    codes = (torch.randn(n, k, generator=gen) * 50).to(torch.float8_e4m3fn)
    shape = (n,) if group == 0 else (n, k // group)
    scale = (torch.rand(shape, generator=gen) + 0.5).to(torch.bfloat16 if group == 0 else
                                                         torch.float16)
    x = torch.randn(batch, k, generator=gen).to(torch.bfloat16)
    kw = engine_launch(batch, n, k, codes, scale, sms=4)  # 4 "SMs": the tiny shapes split K
    assert kw.get("fma", False) == (batch == 1)
    assert kw.get("atomic", False) == (batch == 1 and n == 40)
    if group and batch == 1:  # 32-row programs (N >= 6144) loop over 256 K, others 128
        assert kw["group_k"] == (256 if n >= 6144 else 128)
    want = dequant_gemv_ref(x.float(), codes, scale)
    got = dequant_gemv_triton(x.to(device), codes.to(device), scale.to(device), **kw)
    assert rel_err(got, want) < gemv_tol(k)


@pytest.mark.parametrize("n, k", [(40, 256), (300, 1024)])
def test_engine_launch_of_plain_bf16_rows(device, n, k):
    """One row of a plain bf16 weight takes the fma variant (the H200 bf16 sweep's winner over
    cuBLAS), several rows keep the dot path; both agree with F.linear."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    for batch in (1, 3):
        x = torch.randn(batch, k, generator=gen).to(torch.bfloat16)
        kw = engine_launch(batch, n, k, w, None)
        assert kw.get("fma", False) == (batch == 1)
        got = dequant_gemv_triton(x.to(device), w.to(device), None, **kw)
        assert rel_err(got, x.float() @ w.float().t()) < gemv_tol(k)
