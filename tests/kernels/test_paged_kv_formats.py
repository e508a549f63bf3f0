"""Every `--kv-dtype` read in place by the paged kernels (`kernels.paged_kv`): decode and prefill
over pools written by the `codecs.kv` codecs, against the torch references (which decode the pages
through the same codecs). On the CPU (interpreter) the queries are fp32 and the dot runs in fp32,
so the kernels must match the codecs' dequantisation almost exactly; on CUDA they are bf16.

Slots no sequence wrote hold NaN scales (or NaN rows), so a kernel that loads past the written
keys fails loudly.
"""
import math

import pytest
import torch
import triton
import triton.language as tl

from ninfer_engine.kernels.paged_attention import PAGE, paged_attention_ref, paged_attention_triton
from ninfer_engine.kernels.paged_kv import (FP8, INT4, INT8, NVFP4, PLAIN, _load_kv, gather_kv,
                                            kv_operand)
from ninfer_engine.kernels.paged_prefill import (paged_prefill_ref, paged_prefill_triton,
                                                 paged_prefill_varlen_triton)
from ninfer_engine.kv import KvStorage, PagePool
from ninfer_engine.codecs.kv import KV_DTYPES, as_bits, codecs_for

from tests.tolerance import bound

from .conftest import attention_tol, rel_err

NIBBLE_K_D16 = ("Triton 3.6 on an H200: the paged kernels get a nibble K wrong at D = 16 "
                "(kv.KvStorage.kernel_layout keeps such pools off the kernels)")
FORMATS = {"bf16": (PLAIN, PLAIN), "int8": (INT8, INT8), "fp8": (FP8, FP8),
           "nvfp4": (NVFP4, NVFP4), "k8v4": (INT8, INT4)}


def _setup(device):
    """The activation dtype: fp32 under the interpreter, bf16 on a GPU."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def _tol(q, k, context):
    """`attention_tol` over the pool's decoded keys (both sides read the same codes)."""
    pages = torch.arange(k[0].shape[0])
    return attention_tol(q, gather_kv(k, None, pages, len(pages) * PAGE), context)


def _side(codec, g, n_pages, nkv, D, written, dtype):
    """One of K or V: random rows encoded by `codec` into page views [n_pages, PAGE, nkv, ...],
    every slot outside `written` [n_pages, PAGE] poisoned."""
    x = torch.randn(n_pages * PAGE, nkv, D, generator=g).to(dtype)
    x[:, 0, :4] *= 4  # an outlier channel, so scales differ across groups and heads
    parts = tuple(p.view(n_pages, PAGE, *p.shape[1:]) for p in codec.encode(x))
    junk = ~written
    for p in parts:
        if p.is_floating_point() and p.element_size() > 1:
            p[junk] = float("nan")
        elif p.dtype == torch.float8_e4m3fn:
            as_bits(p)[junk] = 0x7F  # e4m3 NaN
    return parts


def _pool(kv_dtype, g, n_pages, nkv, D, tables, ends, dtype):
    written = torch.zeros(n_pages, PAGE, dtype=torch.bool)
    for table, end in zip(tables, ends):
        for i, p in enumerate(table.tolist()[: -(-end // PAGE)]):
            written[p, : min(end - i * PAGE, PAGE)] = True
    kc, vc = codecs_for(kv_dtype, dtype)
    return (_side(kc, g, n_pages, nkv, D, written, dtype),
            _side(vc, g, n_pages, nkv, D, written, dtype))


def _on(parts, device):
    return tuple(p.to(device) for p in parts)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_operands_name_each_side_s_format(kv_dtype):
    g = torch.Generator().manual_seed(0)
    k, v = _pool(kv_dtype, g, 1, 2, 32, [torch.tensor([0])], [PAGE], torch.float32)
    fmts = tuple(kv_operand(side)[3] for side in (k, v))
    assert fmts == tuple(f.value for f in FORMATS[kv_dtype])
    assert all(kv_operand(side)[5] == 32 for side in (k, v))  # head dim from packed codes too


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_every_kv_dtype_is_kernel_readable(kv_dtype):
    """64-token pages of every KV dtype are read in place, but an nvfp4 K at head dim 16."""
    for dim in (16, 32):
        storage = KvStorage(PagePool(2, PAGE), 1, 1, dim, codecs_for(kv_dtype, torch.float32),
                            torch.float32)
        assert storage.kernel_layout == (dim >= 32 or kv_dtype != "nvfp4")
    storage = KvStorage(PagePool(2, 16), 1, 1, 32, codecs_for(kv_dtype, torch.float32),
                        torch.float32)
    assert not storage.kernel_layout


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("nq, nkv, D", [(4, 2, 32), (2, 1, 16)])
def test_paged_decode_reads_every_kv_dtype(device, kv_dtype, nq, nkv, D):
    if device == "cuda" and D < 32 and kv_dtype == "nvfp4":
        pytest.xfail(NIBBLE_K_D16)
    dtype = _setup(device)
    g = torch.Generator().manual_seed(D + nq)
    B, n_pages = 2, 7
    lens = torch.tensor([70, 150], dtype=torch.int32)
    table = torch.randperm(n_pages, generator=g)[: 3 * B].int().view(B, 3)  # shuffled pages
    k, v = _pool(kv_dtype, g, n_pages, nkv, D, table, lens.tolist(), dtype)
    q = torch.randn(B, nq, D, generator=g).to(dtype)
    ref = paged_attention_ref(q, k, v, table, lens)
    assert not ref.isnan().any()
    out = paged_attention_triton(q.to(device), _on(k, device), _on(v, device), table.to(device),
                                 lens.to(device), max_seq_len=int(lens.max()))
    assert rel_err(out, ref) < _tol(q, k, int(lens.max()))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("D, nq, nkv, start, T", [(32, 4, 2, 5, 70), (16, 2, 1, 100, 7)])
def test_paged_prefill_reads_every_kv_dtype(device, kv_dtype, D, nq, nkv, start, T):
    if device == "cuda" and D < 32 and kv_dtype == "nvfp4":
        pytest.xfail(NIBBLE_K_D16)
    dtype = _setup(device)
    g = torch.Generator().manual_seed(D + start + T)
    n_seq = -(-(start + T) // PAGE)
    table = torch.randperm(n_seq + 2, generator=g)[:n_seq].int()
    k, v = _pool(kv_dtype, g, n_seq + 2, nkv, D, [table], [start + T], dtype)
    q = torch.randn(T, nq, D, generator=g).to(dtype)
    scale = 1 / math.sqrt(D)
    ref = paged_prefill_ref(q, k, v, table, start, scale)
    assert not ref.isnan().any()
    out = paged_prefill_triton(q.to(device), _on(k, device), _on(v, device), table.to(device),
                               start, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < _tol(q, k, start + T)


@pytest.mark.parametrize("kv_dtype", ["fp8", "k8v4"])
def test_paged_prefill_varlen_mixed_formats(device, kv_dtype):
    """Two chunks of different sequences in one launch, with GPU-sized 64-query tiles."""
    dtype = _setup(device)
    g = torch.Generator().manual_seed(9)
    nq, nkv, D = 4, 2, 32
    chunks = [(0, 70), (100, 3)]  # (start, T)
    tables = torch.tensor([[3, 0], [1, 4]])
    k, v = _pool(kv_dtype, g, 5, nkv, D, tables, [s + t for s, t in chunks], dtype)
    q = torch.randn(73, nq, D, generator=g).to(dtype)
    meta = [torch.tensor(x, dtype=torch.int32, device=device) for x in ([0, 70], [70, 3],
                                                                        [0, 100])]
    out = paged_prefill_varlen_triton(q.to(device), _on(k, device), _on(v, device),
                                      tables.to(device), *meta, 70, D**-0.5, block_m=64)
    for b, (o, (s, t)) in enumerate(zip([0, 70], chunks)):
        ref = paged_prefill_ref(q[o: o + t], k, v, tables[b], s, D**-0.5)
        assert rel_err(out[o: o + t], ref) < _tol(q, k, s + t), b


@triton.jit
def _tile_kernel(codes_ptr, scale_ptr, vec_ptr, out_ptr, page, kvh, NKV: tl.constexpr,
                 D: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr):
    tok = tl.arange(0, 64)  # PAGE
    tile = _load_kv(codes_ptr, scale_ptr, vec_ptr, page, tok, kvh, tok < 64, NKV, D, FMT, G,
                    tl.float32)
    tl.store(out_ptr + tok[:, None] * D + tl.arange(0, D)[None, :], tile)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("D", [16, 32, 256])
def test_tile_loader_decodes_like_the_codecs(device, kv_dtype, D):
    """`_load_kv` alone, at real head dims too: one page of one head, fp32 out, against the
    codec's decode: the same fp32 products of exact codes and scales, at most two of them
    (nvfp4: value × block scale × vector scale, in either order), so γ_2 each side."""
    g = torch.Generator().manual_seed(D)
    nkv = 2
    table = torch.tensor([0, 1])
    k, v = _pool(kv_dtype, g, 2, nkv, D, [table], [2 * PAGE], torch.float32)
    for side in (k, v):
        want = gather_kv(side, None, torch.tensor([1]), PAGE)[:, 1]  # page 1, head 1
        codes, sc, vec, fmt, grp, _ = kv_operand(_on(side, device))
        out = torch.empty(PAGE, D, device=device)
        _tile_kernel[(1,)](codes, sc, vec, out, 1, 1, NKV=nkv, D=D, FMT=fmt, G=grp)
        torch.testing.assert_close(out.cpu(), want, rtol=bound(torch.float32, 2), atol=0)
