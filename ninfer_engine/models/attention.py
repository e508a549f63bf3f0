"""Causal GQA attention over a flat token batch made of per-request segments.

A forward pass carries several requests at once: each `Segment` is a run of consecutive tokens
of one request (a prefill chunk, or one decode token) starting at cache position `start`.
The segment's cache is any `SequenceKv`: the paged pool view (`kv.PagedKvCache`) in the
engine, or the contiguous reference cache (`ContiguousKvCache`) for standalone use.

On CUDA, when every segment's cache is a view of one paged pool the kernels read in place
(64-token pages, every KV dtype: the kernels dequantise in registers), a layer writes all
segments' K/V with one scatter and attends with one varlen `kernels.paged_prefill` launch over
the pages (or the paged decode kernel when every segment is one token); otherwise (a contiguous
cache, a head dim or dtype the kernels do not serve) each segment gathers its K/V (`read`) and
runs SDPA.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import torch

from ..host_copy import to_device
from ..kernels._dispatch import use_triton
from ..kernels.paged_attention import paged_attention_triton
from ..kernels.paged_prefill import paged_prefill_triton, paged_prefill_varlen_triton, supported
from ..kv.cache import KvStorage, PagedKvCache
from .layers import sdpa, trailing_causal_mask


class SequenceKv(Protocol):
    """One sequence's K/V across layers, rows laid out [position, kv_heads, head_dim]."""

    def reserve(self, tokens: int) -> bool:
        """Room for `tokens` positions; False when it cannot grow."""

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, D] at positions start .. start+T-1."""

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [end, kv_heads, D] of positions 0 .. end-1."""


@dataclass(frozen=True)
class Segment:
    cache: SequenceKv
    start: int  # cache position of the segment's first token
    length: int


def input_token(seq) -> int:
    """The token a decode row of `seq` computes next: its last output, or before its first the
    prompt's last (`step.runner` runs a prompt's last token as a decode row)."""
    return seq.output[-1] if seq.output else seq.prompt[seq.cached]


@dataclass(frozen=True)
class _Plan:
    segment: Segment
    offset: int  # row of the segment's first token in the flat batch
    is_causal: bool
    device: torch.device

    @cached_property
    def mask(self):
        """None: no mask (one query) or a square causal block (`is_causal`). Built on first
        use (then shared by every layer): the in-place paged path never needs it."""
        seg = self.segment
        if seg.length == 1 or self.is_causal:
            return None
        # chunked prefill: query i sees cache positions ≤ start + i (bottom-right causal)
        return trailing_causal_mask(seg.length, seg.start + seg.length, self.device)


@dataclass(frozen=True)
class _PagedBatch:
    """Every segment of a forward over one kernel-readable paged pool, on the device: what
    the in-place path needs, built once per forward and shared by every layer."""

    storage: KvStorage
    slots: torch.Tensor  # [T] pool slot of each flat row
    tables: torch.Tensor  # [B, max_pages] page ids, row b = segment b's table (zero padded)
    offsets: torch.Tensor  # [B] int32 first flat row of each segment
    lengths: torch.Tensor  # [B] int32
    starts: torch.Tensor  # [B] int32
    max_length: int
    max_end: int  # longest start + length


class Plans(list):
    """The `_Plan`s of one forward (a list), with the paged batch cached on first use."""

    paged: _PagedBatch | None = None
    paged_checked: bool = False


def plan_segments(segments: list[Segment], device: torch.device) -> Plans:
    """Per-segment plans (masks built on first use), shared by every layer of one forward."""
    plans, offset = Plans(), 0
    for seg in segments:
        is_causal = seg.length > 1 and seg.start == 0
        if not seg.cache.reserve(seg.start + seg.length):
            raise RuntimeError("the KV cache cannot grow to hold this segment")
        plans.append(_Plan(seg, offset, is_causal, device))
        offset += seg.length
    return plans


def paged_batch(plans: list[_Plan], q: torch.Tensor) -> _PagedBatch | None:
    """The in-place batch of `plans`, or None when some segment's cache is not a view of one
    kernel-readable paged pool (or q's head dim / dtype is not one the kernel serves)."""
    if isinstance(plans, Plans) and plans.paged_checked:
        return plans.paged
    batch = None
    caches = [plan.segment.cache for plan in plans]
    if (caches and supported(q.shape[-1], q.dtype)
            and all(isinstance(c, PagedKvCache) for c in caches)
            and len({id(c.storage) for c in caches}) == 1 and caches[0].storage.kernel_layout):
        storage = caches[0].storage
        P = storage.page_tokens
        # numpy, not torch: torch's CPU ops on these few thousand indices woke its OpenMP team
        # (repeat_interleave, advanced indexing), ~30 ms a prompt step on the H200's host
        tables = [c.pages for c in caches]
        host_tables = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int64)
        for row, t in enumerate(tables):
            host_tables[row, : len(t)] = t
        meta = np.array([(p.offset, p.segment.length, p.segment.start) for p in plans],
                        dtype=np.int32).T.copy()
        offsets, lengths, starts = meta.astype(np.int64)
        row_seg = np.repeat(np.arange(len(plans)), lengths)
        positions = starts[row_seg] + np.arange(int(lengths.sum())) - offsets[row_seg]
        slots = host_tables[row_seg, positions // P] * P + positions % P
        max_length, max_end = int(lengths.max()), int((lengths + starts).max())
        meta = to_device(meta, q.device)
        batch = _PagedBatch(storage, to_device(slots, q.device), to_device(host_tables, q.device),
                            meta[0], meta[1], meta[2], max_length, max_end)
    if isinstance(plans, Plans):
        plans.paged, plans.paged_checked = batch, True
    return batch


def attend_paged(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  batch: _PagedBatch, scale: float) -> torch.Tensor:
    """One scatter of every row's k/v into the pool, one kernel over the pages in place."""
    s = batch.storage
    s.k_codec.write(s.k[layer], batch.slots, k)
    s.v_codec.write(s.v[layer], batch.slots, v)
    k_pages, v_pages = s.page_view(s.k[layer]), s.page_view(s.v[layer])  # codec components
    T = q.shape[0]
    if batch.max_length == 1 and scale == q.shape[-1] ** -0.5:
        # pure decode: the split-K decode kernel (which scales by 1/√D itself)
        out = paged_attention_triton(q, k_pages, v_pages, batch.tables, batch.starts + 1,
                                     max_seq_len=batch.max_end)
    else:
        out = paged_prefill_varlen_triton(q, k_pages, v_pages, batch.tables, batch.offsets,
                                          batch.lengths, batch.starts, batch.max_length,
                                          scale)
    return out.reshape(T, -1)


def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           plans: list[_Plan], scale: float) -> torch.Tensor:
    """Store k/v [T, kv_heads, D] in each segment's cache and attend; returns [T, heads·D]."""
    if use_triton(q):
        batch = paged_batch(plans, q)
        if batch is not None:
            return attend_paged(layer, q, k, v, batch, scale)
    outputs = []
    for plan in plans:
        seg = plan.segment
        rows = slice(plan.offset, plan.offset + seg.length)
        end = seg.start + seg.length
        seg.cache.write(layer, seg.start, k[rows], v[rows])
        keys, values = seg.cache.read(layer, end)
        out = sdpa(q[rows].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                   values.transpose(0, 1).unsqueeze(0), attn_mask=plan.mask,
                   is_causal=plan.is_causal, scale=scale, enable_gqa=True)
        outputs.append(out[0].transpose(0, 1).reshape(seg.length, -1))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def warm_up_paged_attention(storage: KvStorage, heads: int) -> None:
    """Compile the paged prefill kernel's variants a prompt step can take whatever its rows'
    lengths: 16- and 64-query tiles, each with its pages split over the SMs and not, for
    several chunks (varlen) and for one (a sequence's own attention, `gated_attention`). The
    warm-up's short steps all split; a burst of eight 1K prompts then compiled the unsplit
    64-row variant in traffic (0.76 s on the H200), and the H100's compiled the one-chunk
    unsplit 64-row one. Then the decode kernel as an eager step of one-token rows launches it
    (`attend_paged`: an int64 table, int32 lengths; the decode graphs' launch differs), which
    a `--spec mtp` burst compiled in traffic (0.37 s on the H200). Reads two pages of layer 0,
    writes none."""
    if storage.device.type != "cuda" or not storage.kernel_layout:
        return
    k_pages, v_pages = storage.page_view(storage.k[0]), storage.page_view(storage.v[0])
    # page 0, twice; int64 and int32 metadata as `paged_batch` builds them (the signature
    # is part of a variant: with an int32 table the H200 still compiled the burst's in traffic)
    table = torch.zeros(1, 2, dtype=torch.int64, device=storage.device)
    for rows in (16, 64):
        q = torch.zeros(rows, heads, storage.dim, dtype=storage.dtype, device=storage.device)
        offset, length, start = torch.tensor([[0], [rows], [storage.page_tokens]],
                                             dtype=torch.int32, device=storage.device)
        for splits in (1, 2):
            paged_prefill_varlen_triton(q, k_pages, v_pages, table, offset, length, start, rows,
                                        storage.dim ** -0.5, splits=splits)
            paged_prefill_triton(q, k_pages, v_pages, table[0], storage.page_tokens,
                                 storage.dim ** -0.5, splits=splits)
    q = torch.zeros(2, heads, storage.dim, dtype=storage.dtype, device=storage.device)
    lengths = torch.tensor([1, 2], dtype=torch.int32, device=storage.device)
    paged_attention_triton(q, k_pages, v_pages, table.expand(2, -1).contiguous(), lengths,
                           max_seq_len=2)
