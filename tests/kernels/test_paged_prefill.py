"""Paged prefill attention (`kernels.paged_prefill`): the Triton kernel (interpreter on the
CPU) against its gather + fp32-softmax reference, bf16 and int8 KV."""
import math

import pytest
import torch

from ninfer_engine.kernels.paged_attention import PAGE, dequantize_kv_int8, quantize_kv_int8
from ninfer_engine.kernels.paged_prefill import (
    MIN_SPLIT_PAGES,
    SMS,
    _splits,
    paged_prefill_attention,
    paged_prefill_ref,
    paged_prefill_triton,
    paged_prefill_varlen_triton,
)

from .conftest import attention_tol, rel_err


def _keys(k, ks):
    """The pool's keys decoded (NaN where unwritten, which `attention_tol` ignores)."""
    return k if ks is None else dequantize_kv_int8(k, ks)


def _pool(g, n_pages, nkv, D, table, end, quant):
    """A pool whose slots past `end` of the sequence (and every page it does not own) hold NaN,
    so a kernel that reads beyond the written keys fails loudly."""
    k = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    v = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    ks = vs = None
    if quant:
        (k, ks), (v, vs) = quantize_kv_int8(k, 16), quantize_kv_int8(v, 16)
    written = torch.zeros(n_pages, PAGE, dtype=torch.bool)
    for i, p in enumerate(table.tolist()):
        n = min(max(end - i * PAGE, 0), PAGE)
        written[p, :n] = True
    junk = ~written
    if quant:
        ks[junk], vs[junk] = float("nan"), float("nan")
        k[junk], v[junk] = 127, -127
    else:
        k[junk], v[junk] = float("nan"), float("nan")
    return k, v, ks, vs


# every (start, T) for two head shapes, a few more for the other two (the interpreter is slow)
CASES = [(D, nq, nkv, start, T) for D, nq, nkv in [(16, 2, 1), (32, 4, 2)]
         for start in (0, 5, 64, 100) for T in (1, 7, 64, 70)]
CASES += [(D, nq, nkv, start, T) for D, nq, nkv in [(16, 4, 2), (32, 2, 1)]
          for start, T in [(0, 70), (5, 7), (100, 64)]]


@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("D,nq,nkv,start,T", CASES)
def test_paged_prefill_matches_reference(device, D, nq, nkv, start, T, quant):
    g = torch.Generator().manual_seed(1000 * D + 100 * nq + 7 * start + T + quant)
    n_seq_pages = -(-(start + T) // PAGE)
    n_pages = n_seq_pages + 2  # pages owned by nobody, too
    table = torch.randperm(n_pages, generator=g)[:n_seq_pages].int()  # out of order
    k, v, ks, vs = _pool(g, n_pages, nkv, D, table, start + T, quant)
    q = torch.randn(T, nq, D, generator=g).bfloat16()
    scale = 1 / math.sqrt(D)
    ref = paged_prefill_ref(q, k, v, table, start, scale, ks, vs)
    assert not ref.isnan().any()
    dev = [None if t is None else t.to(device) for t in (q, k, v, table, ks, vs)]
    q_, k_, v_, t_, ks_, vs_ = dev
    out = paged_prefill_triton(q_, k_, v_, t_, start, scale, ks_, vs_)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < attention_tol(q, _keys(k, ks), start + T)


@pytest.mark.parametrize("quant", [False, True])
def test_paged_prefill_varlen_and_strided_q(device, quant):
    """Three chunks of different sequences in one launch (long page table, int64), q a strided
    view as the models hand it over, and the GPU's 64-query tiles."""
    g = torch.Generator().manual_seed(3)
    nq, nkv, D = 4, 2, 32
    chunks = [(0, 70), (100, 1), (30, 50)]  # (start, T)
    n_pages = 12
    perm = torch.randperm(n_pages, generator=g)
    widths = [-(-(s + t) // PAGE) for s, t in chunks]
    tables = torch.zeros(len(chunks), max(widths), dtype=torch.long)
    used = 0
    for b, w in enumerate(widths):
        tables[b, :w] = perm[used: used + w]
        used += w
    k = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    v = torch.randn(n_pages, PAGE, nkv, D, generator=g).bfloat16()
    ks = vs = None
    if quant:
        (k, ks), (v, vs) = quantize_kv_int8(k, 16), quantize_kv_int8(v, 16)
    N = sum(t for _, t in chunks)
    qkv = torch.randn(N, nq + 2 * nkv, D, generator=g).bfloat16()
    q = qkv[:, :nq]
    offsets = torch.tensor([0, 70, 71], dtype=torch.int32)
    lens = torch.tensor([t for _, t in chunks], dtype=torch.int32)
    starts = torch.tensor([s for s, _ in chunks], dtype=torch.int32)
    dev = [None if t is None else t.to(device) for t in (qkv, k, v, tables, offsets, lens,
                                                          starts, ks, vs)]
    out = paged_prefill_varlen_triton(dev[0][:, :nq], dev[1], dev[2], dev[3], dev[4], dev[5],
                                      dev[6], 70, D**-0.5, dev[7], dev[8], block_m=64)
    for b, (s, t) in enumerate(chunks):
        o = int(offsets[b])
        ref = paged_prefill_ref(q[o: o + t], k, v, tables[b], s, D**-0.5, ks, vs)
        assert rel_err(out[o: o + t], ref) < attention_tol(q, _keys(k, ks), s + t), b


@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("start,T,splits", [(100, 70, 2), (200, 7, 3), (130, 64, 5),
                                            (0, 20, 2)])
def test_split_pages_merge_to_the_reference(device, start, T, splits, quant):
    """A chunk's pages folded in `splits` runs and merged (a short chunk over a long context):
    runs a query sees nothing of (its keys all later) weigh zero, not NaN; more runs than
    pages leave some empty."""
    g = torch.Generator().manual_seed(17 * start + T + splits + quant)
    nq, nkv, D = 4, 2, 16
    n_seq_pages = -(-(start + T) // PAGE)
    table = torch.randperm(n_seq_pages + 1, generator=g)[:n_seq_pages].int()
    k, v, ks, vs = _pool(g, n_seq_pages + 1, nkv, D, table, start + T, quant)
    q = torch.randn(T, nq, D, generator=g).bfloat16()
    ref = paged_prefill_ref(q, k, v, table, start, D**-0.5, ks, vs)
    dev = [None if t is None else t.to(device) for t in (q, k, v, table, ks, vs)]
    out = paged_prefill_triton(*dev[:4], start, D**-0.5, *dev[4:], splits=splits)
    assert not out.isnan().any()
    assert rel_err(out, ref) < attention_tol(q, _keys(k, ks), start + T, splits)
    # the varlen form: two chunks, the table padded past the shorter one's pages
    tables = torch.stack([table, table.roll(1)])
    starts = torch.tensor([start, max(start - 64, 0)], dtype=torch.int32)
    lens = torch.tensor([T, T], dtype=torch.int32)
    offsets = torch.tensor([0, T], dtype=torch.int32)
    qq = torch.cat([q, q.flip(0)])
    dev = [t.to(device) for t in (qq, tables, offsets, lens, starts)]
    out = paged_prefill_varlen_triton(dev[0], *[None if t is None else t.to(device)
                                                for t in (k, v)], *dev[1:], T, D**-0.5,
                                      *[None if t is None else t.to(device) for t in (ks, vs)],
                                      splits=splits)
    assert rel_err(out[:T], ref) < attention_tol(q, _keys(k, ks), start + T, splits)


def test_short_chunks_over_long_contexts_split_their_pages():
    """The split rule: a launch of fewer programs than SMs splits into about two waves, each
    run ≥ MIN_SPLIT_PAGES pages; a full launch or a short context does not split."""
    assert _splits(16, 512) == -(-2 * SMS // 16)  # 64 queries of 16 heads over 32K keys
    assert _splits(16, 8) == 8 // MIN_SPLIT_PAGES
    assert _splits(16, MIN_SPLIT_PAGES - 1) == 1
    assert _splits(SMS, 512) == 1


def test_dispatch_takes_the_reference_on_cpu():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 2, 16, generator=g)
    k = torch.randn(2, PAGE, 1, 16, generator=g)
    v = torch.randn(2, PAGE, 1, 16, generator=g)
    table = torch.tensor([1, 0], dtype=torch.int32)
    out = paged_prefill_attention(q, k, v, table, 60, 0.25)
    assert torch.equal(out, paged_prefill_ref(q, k, v, table, 60, 0.25))
