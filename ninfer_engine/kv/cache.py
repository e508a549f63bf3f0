"""Paged KV storage: one pool of quantized K/V slots per attention layer, and per-owner views.

`KvStorage` holds, for every attention layer, the K and V codec storage of all pool pages
(slot = `page * page_tokens + offset`). When an elastic pool grows, every tensor is replaced by
a bigger one holding a copy of the old slots: reads stay one gather over one tensor per layer,
at the cost of a transient old + new copy during the growth step. `PagedKvCache` is one
sequence's view through its page table: `write` quantizes new rows into their slots, `read`
gathers the sequence's pages of one layer into a contiguous dequantized tensor (one gather per
layer, no per-token loop). With `row_width`, every slot also holds one plain row a drafter keeps
with the pages (`--spec dflash`: its conditioning c_t, `step.dflash_drafter`; `--spec mtp`: its
layer's K and V and the target's hidden, `step.mtp_drafter`): shared, copied, grown and moved to
the host tier with the K/V, so a reused prefix brings it along.
"""
from __future__ import annotations

from typing import Any

import torch

from ..host_copy import to_device
from .pages import PageAllocator, pages_for
from ..codecs.kv import KvCodec, as_bits


def kv_page_layout(layers: int, heads: int, dim: int, codecs: tuple[KvCodec, KvCodec],
                   page_tokens: int, row_bytes: int = 0) -> tuple[int, int]:
    """(bytes of one pool page: K and V of every layer, codes and scales, and `row_bytes` a
    slot of drafter rows; tensors the pool holds) as `KvStorage` lays it out, read off the
    codecs' own `allocate` on the meta device: nothing is allocated and no codec's layout is
    restated (`--kv-capacity auto`)."""
    meta = torch.device("meta")
    parts = [t for codec in codecs for t in codec.allocate(page_tokens, heads, dim, meta)]
    return (layers * sum(t.nbytes for t in parts) + page_tokens * row_bytes,
            layers * len(parts) + (row_bytes > 0))


def keeps_rows(seq) -> bool:
    """Whether `seq`'s pages hold drafter rows (prefix reuse on with a drafter that keeps
    them: `rank_parts`)."""
    return seq.cache is not None and seq.cache.storage.rows is not None


class KvStorage:
    """K/V of every pool page for `layers` attention layers, laid out per the two codecs."""

    def __init__(self, allocator: PageAllocator, layers: int, heads: int, dim: int,
                 codecs: tuple[KvCodec, KvCodec], activation_dtype: torch.dtype,
                 device: torch.device | str = "cpu", row_width: int = 0) -> None:
        self.allocator = allocator
        self.page_tokens = allocator.page_tokens
        self.heads, self.dim = heads, dim
        self.k_codec, self.v_codec = codecs
        self.dtype = activation_dtype
        self.device = torch.device(device)
        slots = allocator.total * self.page_tokens
        self.k = [self.k_codec.allocate(slots, heads, dim, self.device) for _ in range(layers)]
        self.v = [self.v_codec.allocate(slots, heads, dim, self.device) for _ in range(layers)]
        self.row_width = row_width
        # the drafter rows, in the activation dtype (what the drafter computes them in)
        self.rows = (torch.zeros(slots, row_width, dtype=activation_dtype, device=self.device)
                     if row_width else None)
        self.page_bytes = self.nbytes // allocator.total  # one page: K + V, all layers, rows
        allocator.on_grow(self._grow)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.stored() for t in layer)

    def stored(self) -> list[tuple[torch.Tensor, ...]]:
        """Every tensor a page has slots in: each layer's K, then V, components, then the
        drafter rows (read now: an elastic pool regrows them)."""
        return [*self.k, *self.v, *([(self.rows,)] if self.rows is not None else [])]

    def _grow(self, pages: int) -> None:
        """Resize every layer's storage to `pages` pages, keeping the stored slots; all or
        nothing, with `MemoryError` when the device cannot hold the bigger tensors."""
        slots = pages * self.page_tokens
        try:
            k = [self._resized(self.k_codec, layer, slots) for layer in self.k]
            v = [self._resized(self.v_codec, layer, slots) for layer in self.v]
            rows = None
            if self.rows is not None:
                rows = self.rows.new_zeros(slots, self.row_width)
                rows[: self.rows.shape[0]] = self.rows
        except torch.OutOfMemoryError as exc:
            raise MemoryError(str(exc)) from exc
        self.k, self.v, self.rows = k, v, rows

    def _resized(self, codec: KvCodec, layer: tuple, slots: int) -> tuple:
        bigger = codec.allocate(slots, self.heads, self.dim, self.device)
        for old, new in zip(layer, bigger):
            as_bits(new)[: old.shape[0]].copy_(as_bits(old))
        return bigger

    def new_cache(self) -> PagedKvCache:
        return PagedKvCache(self)

    def page_view(self, stored: tuple) -> tuple[torch.Tensor, ...]:
        """One layer's K or V as stored (the codec's components: codes, then any scales) viewed
        as [pages, page_tokens, heads, ...]: the operand the paged-attention kernels read in
        place and dequantise (`kernels.paged_kv`), whatever the KV dtype."""
        return tuple(t.view(-1, self.page_tokens, *t.shape[1:]) for t in stored)

    @property
    def kernel_layout(self) -> bool:
        """True when the paged-attention kernels (`kernels.paged_attention`,
        `kernels.paged_prefill`) can read this pool in place: 64-token pages. They read every
        KV dtype's storage (plain rows, int8, fp8, nvfp4, k8v4's int8 K and int4 V), except a
        nibble-packed K at head dim 16, which the decode kernel gets wrong on an H200
        (`kernels.paged_kv`)."""
        nibble_k = self.k_codec.name in ("nvfp4", "int4")
        return self.page_tokens == 64 and not (nibble_k and self.dim < 32)

    def copy_slots(self, src_page: int, dst_page: int, count: int) -> None:
        """Copy the first `count` token slots of a page, every layer and the drafter rows, as
        stored (no requantize)."""
        recorder = getattr(self, "recorder", None)  # for tensor-parallel followers
        if recorder is not None:
            recorder.ops.append(("slots", src_page, dst_page, count))
        src = slice(src_page * self.page_tokens, src_page * self.page_tokens + count)
        dst = slice(dst_page * self.page_tokens, dst_page * self.page_tokens + count)
        for layer in self.stored():
            for stored in map(as_bits, layer):
                stored[dst] = stored[src]


class PagedKvCache:
    """One owner's K/V through its page table; the owner key in the allocator is this object."""

    def __init__(self, storage: KvStorage) -> None:
        self.storage = storage
        self._table_tensor = torch.empty(0, dtype=torch.long, device=storage.device)

    @property
    def pages(self) -> list[int]:
        return self.storage.allocator.table(self)

    @property
    def capacity(self) -> int:
        return len(self.pages) * self.storage.page_tokens

    def reserve(self, tokens: int) -> bool:
        """Grow the lease to cover `tokens` positions; False when the pool has too few pages."""
        return tokens <= self.capacity or self.storage.allocator.grow(self, tokens)

    def release(self) -> None:
        self.storage.allocator.release(self)

    def table_tensor(self) -> torch.Tensor:
        """The page table as a device tensor of page ids (rebuilt when the lease grows)."""
        pages = self.pages
        # tables only grow, so the length tells whether the cached tensor is current
        if self._table_tensor.numel() != len(pages):
            self._table_tensor = to_device(pages, self.storage.device, torch.long)
        return self._table_tensor

    def layer_pages(self, layer: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """(K components, V components) of one layer as whole-pool page views
        `[pages, page_tokens, heads, ...]` (`KvStorage.page_view`): with `table_tensor()` what a
        paged kernel reads in place."""
        s = self.storage
        return s.page_view(s.k[layer]), s.page_view(s.v[layer])

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, heads, dim] at positions start .. start+T-1."""
        s, n = self.storage, k.shape[0]
        positions = torch.arange(start, start + n, device=s.device)
        pages = self.table_tensor()[positions // s.page_tokens]
        slots = pages * s.page_tokens + positions % s.page_tokens
        s.k_codec.write(s.k[layer], slots, k)
        s.v_codec.write(s.v[layer], slots, v)

    def _slots(self, start: int, end: int) -> torch.Tensor:
        """The pool slots of positions start .. end-1."""
        s = self.storage
        positions = torch.arange(start, end, device=s.device)
        return self.table_tensor()[positions // s.page_tokens] * s.page_tokens + (
            positions % s.page_tokens)

    def write_rows(self, start: int, rows: torch.Tensor, column: int = 0) -> None:
        """Store drafter rows [T, W] at positions start .. start+T-1, in columns column ..
        column+W-1 of their slots (a drafter may fill a slot's parts at different times)."""
        slots = self._slots(start, start + rows.shape[0])
        self.storage.rows[slots, column: column + rows.shape[1]] = rows

    def read_rows(self, end: int) -> torch.Tensor:
        """The drafter rows of positions 0 .. end-1, [end, row_width]."""
        return self.storage.rows[self._slots(0, end)]

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions 0 .. end-1 as [end, heads, dim] in the activation dtype."""
        s = self.storage
        pages = self.table_tensor()[: pages_for(end, s.page_tokens)]
        k = s.k_codec.read(s.k[layer], pages, s.page_tokens, s.dtype)[:end]
        v = s.v_codec.read(s.v[layer], pages, s.page_tokens, s.dtype)[:end]
        return k, v


class PageTables:
    """A device page table `table` [rows, max_pages] whose row b starts with cache b's page ids
    (the rest is stale and never read: each row's length bounds what a kernel reads).

    `fill` copies only what changed since the last fill: a row whose cache is the same and
    whose lease did not grow is left alone (tables only grow), so a running batch pays one
    small copy per row every `page_tokens` steps instead of one per row every step."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self._rows: list[tuple[PagedKvCache, int] | None] = [None] * table.shape[0]

    def fill(self, caches: list[PagedKvCache]) -> None:
        for row, cache in enumerate(caches):
            held = self._rows[row]
            n = len(cache.pages)
            start = held[1] if held is not None and held[0] is cache else 0
            if start < n:
                self.table[row, start:n].copy_(cache.table_tensor()[start:n])
                self._rows[row] = (cache, n)


class LayerKv:
    """One attention layer of a `PagedKvCache` as the hybrid model's per-layer KV state.

    Matches the contiguous `gated_attention.KVCache` contract (`length`, `extend`) with
    head-major [heads, T, dim] tensors.
    """

    def __init__(self, cache: PagedKvCache, layer: int, start: int, plans: Any = None) -> None:
        self.cache, self.layer, self.length = cache, layer, start
        # the step's `models.attention.Plans` when its rows attend together (one scatter and
        # one varlen launch a layer for all of them), shared by every view of the step
        self.plans = plans

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.append(k, v)
        keys, values = self.cache.read(self.layer, self.length)
        return keys.transpose(0, 1), values.transpose(0, 1)

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on (their slots are written again before any read)."""
        self.length = length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v [heads, T, dim] at positions length .. length+T-1 without reading back
        (for kernels that read the pages in place: `layer_pages`, `cache.table_tensor()`)."""
        self.cache.write(self.layer, self.length, k.transpose(0, 1), v.transpose(0, 1))
        self.length += k.shape[1]

    @property
    def kernel_readable(self) -> bool:
        """The pool's layout is one the paged kernels read in place (`KvStorage.kernel_layout`)."""
        return self.cache.storage.kernel_layout

    def layer_pages(self):
        """This layer's (K components, V components) page views (see
        `PagedKvCache.layer_pages`)."""
        return self.cache.layer_pages(self.layer)
