"""Prefill attention over a paged KV cache, read in place (flash-attention forward, GQA).

A prefill chunk of T queries sits at absolute positions `start .. start+T-1` of its sequence;
its keys/values are positions `0 .. start+T-1`, already written into the pages (layout of
`kernels.paged_attention`: `[num_pages, PAGE=64, nkv, ...]` page views). K and V are each read in
place in any `--kv-dtype` format, dequantised in the kernel by `kernels.paged_kv`'s tile loader:
bf16/fp16 rows, int8 codes with fp16 group scales (`k_scale` / `v_scale`), or a codec's tuple
of component page views (bf16, int8, fp8, nvfp4, k8v4). Query i sees keys ≤ start+i
(bottom-right causal); query head h reads KV head h // (nq // nkv).

The Triton path is varlen: one launch covers B chunks (`q_offsets`, `q_lens`, `starts`, one page
table row each); `paged_prefill_triton` is the one-chunk form (length and start passed as
scalars, nothing uploaded per call). A program owns BLOCK_M queries of one chunk and one query
head, walks that chunk's pages (64 keys a step) up to the last one its queries can see, and
keeps an online softmax in fp32. Nothing the size of [T, L] is materialised.

A short chunk over a long context (an agent's turn over its cached prompt) has few such
programs: 64 queries of the 35B-A3B are 16, each walking all 512 pages of a 32K context (1.3 ms
a layer on the H200, 37 % of a 64-token turn's kernels, h200-host-tier-ttft-35b-a3b-profile.txt).
There the pages are split too ("flash decoding"): each program folds one run of them and
`paged_attention`'s merge kernel combines the partial softmaxes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import dot_dtype, interpreting, use_triton
from .paged_attention import MERGE_SPLITS, _paged_merge_kernel
from .paged_kv import PAGE, _load_kv, _softmax_step, gather_kv, kv_operand

SMS = 132  # the H200's SMs: a launch of fewer programs than this splits its pages (`_splits`)
MIN_SPLIT_PAGES = 4  # pages a split folds at least (below, the merge costs more than it saves)


def supported(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the kernel serves queries of this head dim and dtype: whole power-of-two heads of
    at least 16 (`tl.dot`'s minimum), bf16/fp16 activations (its products run in bf16 on a GPU;
    fp32 only under the interpreter, whose products are fp32)."""
    pow2 = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return pow2 and (dtype in (torch.bfloat16, torch.float16) or interpreting())


def paged_prefill_ref(q, k_pages, v_pages, page_table, start: int, scale: float,
                      k_scale=None, v_scale=None):
    """q [T, nq, D] at positions start .. start+T-1 -> [T, nq, D] in q's dtype (KV decoded
    through its codecs, fp32)."""
    T, nq, D = q.shape
    L = start + T
    pages = page_table[: -(-L // PAGE)].long()
    k, v = gather_kv(k_pages, k_scale, pages, L), gather_kv(v_pages, v_scale, pages, L)
    r = nq // k.shape[1]
    k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)  # [L, nq, D]
    s = torch.einsum("thd,lhd->htl", q.float(), k) * scale
    q_pos = torch.arange(start, L, device=q.device)
    allowed = torch.arange(L, device=q.device)[None, :] <= q_pos[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("htl,lhd->thd", torch.softmax(s, -1), v).to(q.dtype)


# one compile whatever T, start, split count and the widest page table of the step, and wherever
# the step's metadata rows start in their packed buffer (a [3, B] int32 tensor's rows are
# 16-byte aligned only when B % 4 == 0: the H200 compiled a variant for 8 prompts after warming 3)
@triton.jit(do_not_specialize=["one_len", "one_start", "table_stride", "n_splits"],
            do_not_specialize_on_alignment=["table_ptr", "qoff_ptr", "qlen_ptr", "start_ptr"])
def _paged_prefill_kernel(q_ptr, k_ptr, ks_ptr, kv_ptr, v_ptr, vs_ptr, vv_ptr, table_ptr,
                          qoff_ptr, qlen_ptr, start_ptr, out_ptr, acc_ptr, ml_ptr, one_len,
                          one_start, n_splits, stride_qt, stride_qh, table_stride, sm_scale,
                          NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr,
                          BLOCK_M: tl.constexpr, KF: tl.constexpr, KG: tl.constexpr,
                          VF: tl.constexpr, VG: tl.constexpr, VARLEN: tl.constexpr,
                          SPLIT: tl.constexpr, DOT: tl.constexpr):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2) // n_splits
    split = tl.program_id(2) % n_splits
    if VARLEN:
        q_len = tl.load(qlen_ptr + b)
    else:  # one chunk: length and start come as scalars (no metadata upload per call)
        q_len = one_len
    if mb * BLOCK_M < q_len:
        if VARLEN:
            q_off = tl.load(qoff_ptr + b)
            start = tl.load(start_ptr + b)
        else:
            q_off = 0
            start = one_start
        kvh = h // (NQ // NKV)
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < q_len
        d = tl.arange(0, D)
        tok = tl.arange(0, 64)
        q = tl.load(q_ptr + (q_off + rows)[:, None] * stride_qt + h * stride_qh + d[None, :],
                    mask=rmask[:, None], other=0.0).to(DOT)
        q_pos = start + rows
        n_keys = start + q_len  # keys written for this chunk: 0 .. start+q_len-1
        # pages wholly above the causal diagonal of this block's last query are never read
        last_key = start + tl.minimum(mb * BLOCK_M + BLOCK_M, q_len) - 1
        n_pages = last_key // 64 + 1
        # this program's run of them: the chunk's pages in `n_splits` equal runs
        per_split = tl.cdiv((n_keys - 1) // 64 + 1, n_splits)
        first = split * per_split
        n_pages = tl.minimum(n_pages, first + per_split)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        qk_scale = sm_scale * 1.4426950408889634  # exp2 instead of exp
        for i in range(first, n_pages):
            page = tl.load(table_ptr + b * table_stride + i).to(tl.int64)
            key = i * 64 + tok
            # slots past the chunk's end may hold garbage (even NaN): never load them
            kmask = key < n_keys
            k = _load_kv(k_ptr, ks_ptr, kv_ptr, page, tok, kvh, kmask, NKV, D, KF, KG, DOT)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(key[None, :] <= q_pos[:, None], s, float("-inf"))
            # a query may see none of a split's page yet (its keys all after it): weight 0
            m, l, p, alpha = _softmax_step(s, m, l)
            v = _load_kv(v_ptr, vs_ptr, vv_ptr, page, tok, kvh, kmask, NKV, D, VF, VG, DOT)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v)
        if SPLIT:  # the partial softmax, for the merge (`paged_attention._paged_merge_kernel`)
            part = ((q_off + rows) * NQ + h) * n_splits + split
            tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=rmask[:, None])
            tl.store(ml_ptr + part * 2, m, mask=rmask)
            tl.store(ml_ptr + part * 2 + 1, l, mask=rmask)
        else:
            o = acc / l[:, None]
            tl.store(out_ptr + ((q_off + rows) * NQ + h)[:, None] * D + d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=rmask[:, None])


def _block_m(max_q_len: int) -> int:
    # the interpreter runs every program in Python: small tiles keep the CPU tests quick; on a
    # GPU, 16-query tiles for decode-sized chunks
    return 16 if interpreting() or max_q_len <= 16 else 64


def paged_prefill_varlen_triton(q, k_pages, v_pages, page_tables, q_offsets, q_lens, starts,
                                max_q_len: int, scale: float, k_scale=None, v_scale=None,
                                block_m: int | None = None, splits: int | None = None):
    """B chunks in one launch. q [N, nq, D] (any strides but the last; chunk b is rows
    q_offsets[b] .. +q_lens[b], at positions starts[b] ..); page_tables [B, max_pages] (int32
    or int64); q_offsets, q_lens, starts [B] int32 device tensors; `max_q_len` (host int) ≥
    every q_lens[b] sizes the grid. Returns [N, nq, D] in q's dtype (rows outside every chunk
    are left unwritten)."""
    return _launch(q, k_pages, v_pages, page_tables, (q_offsets, q_lens, starts), max_q_len, 0,
                   scale, k_scale, v_scale, block_m, splits)


def _splits(programs: int, max_pages: int) -> int:
    """Runs to split each chunk's pages into: about two waves of programs over the SMs where
    the chunk's own (query tile, head) programs are fewer than the SMs, each run at least
    `MIN_SPLIT_PAGES` pages; 1 (no merge) otherwise."""
    if programs >= SMS:
        return 1
    return max(1, min(-(-2 * SMS // programs), max_pages // MIN_SPLIT_PAGES))


def _launch(q, k_pages, v_pages, page_tables, meta, max_q_len, start, scale, k_scale, v_scale,
            block_m, splits=None):
    """`meta` (offsets, lengths, starts) for varlen, or None for one chunk of all q's rows
    at position `start`. `splits` (None: `_splits`) runs of pages per chunk."""
    N, nq, D = q.shape
    k, ks, kv, kf, kg, kd = kv_operand(k_pages, k_scale)
    v, vs, vv, vf, vg, vd = kv_operand(v_pages, v_scale)
    nkv = k.shape[2]
    assert D >= 16 and D & (D - 1) == 0 and nq % nkv == 0 and kd == vd == D
    assert k.shape[1] == v.shape[1] == PAGE
    if q.stride(-1) != 1:
        q = q.contiguous()
    B = page_tables.shape[0]
    out = torch.empty(N, nq, D, dtype=q.dtype, device=q.device)
    if N == 0 or B == 0 or max_q_len == 0:
        return out
    block_m = block_m or _block_m(max_q_len)
    varlen = meta is not None
    blocks = triton.cdiv(max_q_len, block_m)
    # the most pages a chunk reads: the table's width, or the one chunk's own
    max_pages = page_tables.shape[1] if varlen else -(-(start + max_q_len) // PAGE)
    splits = splits or _splits(blocks * B * nq, max_pages)
    acc = ml = out  # unread unless split
    if splits > 1:
        acc = torch.empty(N * nq * splits, D, dtype=torch.float32, device=q.device)
        ml = torch.empty(N * nq * splits, 2, dtype=torch.float32, device=q.device)
    q_offsets, q_lens, starts = meta if varlen else (page_tables,) * 3  # unread pointers
    _paged_prefill_kernel[(blocks, B, nq * splits)](
        q, k, ks, kv, v, vs, vv, page_tables, q_offsets, q_lens, starts, out, acc, ml, N, start,
        splits, q.stride(0), q.stride(1), page_tables.stride(0), scale, NQ=nq, NKV=nkv, D=D,
        BLOCK_M=block_m, KF=kf, KG=kg, VF=vf, VG=vg, VARLEN=varlen, SPLIT=splits > 1,
        DOT=dot_dtype(), num_warps=8 if D >= 256 else 4,
        num_stages=2 if D >= 256 else 3)
    if splits > 1:  # rows outside every chunk merge garbage, as they are left unwritten else
        _paged_merge_kernel[(N * nq,)](acc, ml, out, splits, D=D, SB=MERGE_SPLITS)
    return out


def paged_prefill_triton(q, k_pages, v_pages, page_table, start: int, scale: float,
                         k_scale=None, v_scale=None, block_m: int | None = None,
                         splits: int | None = None):
    """One chunk, q [T, nq, D] at positions start .. start+T-1 over `page_table` [n_pages];
    length and start go to the kernel as scalars (nothing is uploaded per call)."""
    return _launch(q, k_pages, v_pages, page_table[None], None, q.shape[0], start, scale,
                   k_scale, v_scale, block_m, splits)


def paged_prefill_attention(q, k_pages, v_pages, page_table, start: int, scale: float,
                            k_scale=None, v_scale=None):
    """Dispatching entry point. q [T, nq, D] at positions start .. start+T-1; page_table
    [n_pages_of_seq] (int32/int64) -> [T, nq, D] in q's dtype. See the module docstring."""
    if use_triton(q):
        return paged_prefill_triton(q, k_pages, v_pages, page_table, start, scale, k_scale,
                                    v_scale)
    return paged_prefill_ref(q, k_pages, v_pages, page_table, start, scale, k_scale, v_scale)
