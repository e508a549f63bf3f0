"""Decode attention over a paged KV cache (one query token per sequence, GQA).

Layout: K and V are `[num_pages, PAGE, nkv, ...]` page views with PAGE = 64 tokens;
`page_table[b, i]` is the page holding tokens `[64i, 64i+64)` of sequence b, `seq_lens[b]` its
length. K and V are each read in place in any `--kv-dtype` storage format, dequantised inside
the kernel (`kernels.paged_kv`): a bare tensor of bf16/fp16 rows, int8 codes with per-group
scales `[num_pages, PAGE, nkv, D // G]` (passed as `k_scale` / `v_scale`, symmetric absmax, see
`quantize_kv_int8`), or the tuple of a `codecs.kv` codec's component page views (bf16, int8, fp8,
nvfp4, k8v4's int8 K and int4 V; `KvStorage.page_view`). The Triton path is split-K ("flash
decoding"): each program folds a run of pages for one (sequence, KV head) with all its query
heads, then a second kernel merges the partial softmaxes.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, use_triton
from .paged_kv import PAGE, _load_kv, _softmax_step, gather_kv, kv_operand
from .pdl import pdl_launch, pdl_release, pdl_wait


def quantize_kv_int8(x, group):
    """x [..., D] -> (int8 codes [..., D], fp16 scales [..., D // group]), absmax per group."""
    g = x.float().unflatten(-1, (-1, group))
    scale = (g.abs().amax(-1) / 127.0).clamp_min(1e-8).half()
    codes = torch.round(g / scale.float()[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes.flatten(-2), scale


def dequantize_kv_int8(codes, scale):
    """Inverse of `quantize_kv_int8`, in fp32."""
    g = codes.float().unflatten(-1, (scale.shape[-1], -1))
    return (g * scale.float()[..., None]).flatten(-2)


def paged_attention_ref(q, k_pages, v_pages, page_table, seq_lens, k_scale=None, v_scale=None):
    """q [B, nq, D] -> [B, nq, D] in q's dtype; KV decoded through its codecs, softmax and
    products in fp32."""
    B, nq, D = q.shape
    out = torch.empty_like(q)
    for b in range(B):
        L = int(seq_lens[b])
        pages = page_table[b, : -(-L // PAGE)].long()
        k, v = gather_kv(k_pages, k_scale, pages, L), gather_kv(v_pages, v_scale, pages, L)
        r = nq // k.shape[1]  # k, v [L, nkv, D]
        k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
        s = torch.einsum("hd,lhd->hl", q[b].float(), k) / math.sqrt(D)
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v).to(q.dtype)
    return out


# per-step integers and scalar-read metadata (slices of a packed buffer in the eager step):
# a new width, split count or buffer offset must not compile a new variant while serving
@triton.jit(do_not_specialize=["max_pages", "pages_per_split"],
            do_not_specialize_on_alignment=["table_ptr", "lens_ptr"])
def _paged_split_kernel(q_ptr, k_ptr, ks_ptr, kv_ptr, v_ptr, vs_ptr, vv_ptr, table_ptr,
                        lens_ptr, acc_ptr, ml_ptr, max_pages, pages_per_split, sm_scale,
                        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, QB: tl.constexpr,
                        KF: tl.constexpr, KG: tl.constexpr, VF: tl.constexpr, VG: tl.constexpr,
                        DOT: tl.constexpr,
                        PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = pid // NKV
    kvh = pid % NKV
    R: tl.constexpr = NQ // NKV
    hq = tl.arange(0, QB)
    d = tl.arange(0, D)
    tok = tl.arange(0, 64)
    q = tl.load(q_ptr + (b * NQ + kvh * R + hq)[:, None] * D + d[None, :],
                mask=(hq < R)[:, None], other=0.0).to(DOT)
    L = tl.load(lens_ptr + b)
    first = split * pages_per_split
    last = tl.minimum(first + pages_per_split, tl.cdiv(L, 64))
    m = tl.full([QB], float("-inf"), tl.float32)
    l = tl.zeros([QB], tl.float32)
    acc = tl.zeros([QB, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # exp2 instead of exp
    for i in range(first, last):
        page = tl.load(table_ptr + b * max_pages + i)
        tmask = i * 64 + tok < L
        k = _load_kv(k_ptr, ks_ptr, kv_ptr, page, tok, kvh, tmask, NKV, D, KF, KG, DOT)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(tmask[None, :], s, float("-inf"))
        m, l, p, alpha = _softmax_step(s, m, l)
        v = _load_kv(v_ptr, vs_ptr, vv_ptr, page, tok, kvh, tmask, NKV, D, VF, VG, DOT)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v)
    rows = (b * NQ + kvh * R + hq) * n_splits + split
    hmask = hq < R
    tl.store(acc_ptr + rows[:, None] * D + d[None, :], acc, mask=hmask[:, None])
    tl.store(ml_ptr + rows * 2, m, mask=hmask)
    tl.store(ml_ptr + rows * 2 + 1, l, mask=hmask)


@triton.jit(do_not_specialize=["n_splits"])
def _paged_merge_kernel(acc_ptr, ml_ptr, out_ptr, n_splits,
                        D: tl.constexpr, SB: tl.constexpr,
                        PDL: tl.constexpr = 0):
    pdl_wait(PDL)  # `kernels.pdl`
    pdl_release(PDL)
    row = tl.program_id(0)
    d = tl.arange(0, D)
    # SB splits at a time with a running max: one compiled variant for every split count (a
    # block of all of them made one per power of two; a long context's compiled in traffic)
    m_run = tl.full((1,), float("-inf"), tl.float32)
    l_run = tl.zeros((1,), tl.float32)
    o_run = tl.zeros((D,), tl.float32)
    for s0 in range(0, n_splits, SB):
        sp = s0 + tl.arange(0, SB)
        smask = sp < n_splits
        base = row * n_splits + sp
        m = tl.load(ml_ptr + base * 2, mask=smask, other=float("-inf"))
        l = tl.load(ml_ptr + base * 2 + 1, mask=smask, other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, axis=0))
        # empty splits (and an all-empty start) carry m = -inf and weigh exactly zero
        keep = tl.where(m_run > float("-inf"), tl.exp2(m_run - m_new), 0.0)
        w = tl.where(m > float("-inf"), tl.exp2(m - m_new), 0.0)
        acc = tl.load(acc_ptr + base[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
        o_run = o_run * keep + tl.sum(acc * w[:, None], axis=0)
        l_run = l_run * keep + tl.sum(l * w, axis=0)
        m_run = m_new
    tl.store(out_ptr + row * D + d, (o_run / l_run).to(out_ptr.dtype.element_ty))


MERGE_SPLITS = 16  # splits a merge program reads at a time


def split_count(batch, nkv, max_pages, sms=132):
    """Splits so that about two waves of programs cover the SMs, at least one page each."""
    return max(1, min(max_pages, -(-2 * sms // (batch * nkv))))


def paged_attention_triton(q, k_pages, v_pages, page_table, seq_lens, k_scale=None,
                           v_scale=None, max_seq_len=None):
    """Triton path. `max_seq_len` (host int) sizes the split grid; default: table width."""
    # the merge writes rows densely: a strided q (a [heads, T] transpose) needs a dense `out`
    q = q.contiguous()
    B, nq, D = q.shape
    k, ks, kv, kf, kg, kd = kv_operand(k_pages, k_scale)
    v, vs, vv, vf, vg, vd = kv_operand(v_pages, v_scale)
    nkv = k.shape[2]
    assert kd == vd == D and k.shape[1] == v.shape[1] == PAGE
    max_pages = page_table.shape[1]
    used = max_pages if max_seq_len is None else -(-max_seq_len // PAGE)
    n_splits = split_count(B, nkv, used)
    pps = -(-used // n_splits)
    n_splits = -(-used // pps)
    acc = torch.empty(B * nq * n_splits, D, dtype=torch.float32, device=q.device)
    ml = torch.empty(B * nq * n_splits, 2, dtype=torch.float32, device=q.device)
    _paged_split_kernel[(B * nkv, n_splits)](
        q, k, ks, kv, v, vs, vv, page_table, seq_lens, acc, ml, max_pages, pps,
        1.0 / math.sqrt(D), NQ=nq, NKV=nkv, D=D, QB=max(16, triton.next_power_of_2(nq // nkv)),
        KF=kf, KG=kg, VF=vf, VG=vg, DOT=dot_dtype(),
        # two stages of K+V tiles: 128 KiB of shared memory
        num_warps=4, num_stages=2, **pdl_launch(q))
    out = torch.empty_like(q)
    _paged_merge_kernel[(B * nq,)](acc, ml, out, n_splits, D=D, SB=MERGE_SPLITS,
                                   **pdl_launch(acc))
    return out


def paged_attention(q, k_pages, v_pages, page_table, seq_lens, k_scale=None, v_scale=None,
                    max_seq_len=None):
    """Dispatching entry point; see the module docstring."""
    if use_triton(q):
        return paged_attention_triton(q, k_pages, v_pages, page_table, seq_lens, k_scale,
                                      v_scale, max_seq_len)
    return paged_attention_ref(q, k_pages, v_pages, page_table, seq_lens, k_scale, v_scale)
