"""The host tier of the prefix cache (`--host-kv-mib`, `--host-state-slots`).

When the prefix tree (`kv.radix`) must give a device page back, it moves the page's K/V (every
layer, as stored: no requantization; and any drafter rows `KvStorage` keeps) into a page of
this tier instead of forgetting it, and a later hit copies it back into a device page;
recurrent-state snapshots that lose their device slot move into host state slots, and a hit
copies one straight into the request's running slot. On CUDA both live in page-locked memory
and every copy is queued on the current stream, so the step that follows reads them in order
and the host never waits on a copy.

Restoring a page costs one PCIe copy of `page_bytes` (about 1.3 MB a 64-token page of the
35B-A3B shape, ~0.05 ms at 25 GB/s) against re-prefilling 64 tokens, so the tier keeps
whatever the device evicts while it has room and drops its own least recently used leaves
when it has none.
"""
from __future__ import annotations

import os

import psutil
import torch

from ..host_copy import to_device
from .cache import KvStorage
from ..codecs.kv import as_bits
from .slots import StatePool

GIB = 2**30


class HostTierRamError(RuntimeError):
    """The host tiers do not fit in the RAM available now (startup exits 1)."""


class HostTier:
    """`pages` host KV pages shaped like `storage`'s and, for the hybrid family, `states`: host
    state slots laid out like the device snapshots."""

    def __init__(self, storage: KvStorage, pages: int, states: StatePool | None = None) -> None:
        self.storage = storage
        self.pinned = storage.device.type == "cuda"
        slots = pages * storage.page_tokens

        def host(codec) -> tuple[torch.Tensor, ...]:
            stored = codec.allocate(slots, storage.heads, storage.dim, "cpu")
            return tuple(t.pin_memory() for t in stored) if self.pinned else stored

        self.k = [host(storage.k_codec) for _ in storage.k]
        self.v = [host(storage.v_codec) for _ in storage.v]
        rows = storage.rows
        self.rows = None if rows is None else (
            torch.zeros(slots, storage.row_width, dtype=rows.dtype, pin_memory=self.pinned))
        self.pages = pages
        self.states = states
        self._free = list(range(pages - 1, -1, -1))

    @property
    def used_pages(self) -> int:
        return self.pages - len(self._free)

    @property
    def kv_bytes(self) -> int:
        return sum(t.nbytes for layer in self._host_layers() for t in layer)

    @property
    def state_bytes(self) -> int:
        if self.states is None:
            return 0
        return sum(t.nbytes for layer in self.states.fields for t in layer.values())

    def take_page(self) -> int | None:
        """A free host page, for `copy_out` to fill; None when the tier is full."""
        return self._free.pop() if self._free else None

    def copy_out(self, pages: list[int], hosts: list[int]) -> None:
        """Device pages `pages` into host pages `hosts`: per stored tensor, one gather of the
        pages into a device buffer, then one copy per run of consecutive host pages (queued on
        the current stream, so the device pages can be leased again at once). A 32K prefix
        demoted page by page was ~2,000 small copies on the H200."""
        runs, src = self._plan(("to_host", tuple(pages), tuple(hosts)), hosts, pages)
        P = self.storage.page_tokens
        for of_layer, to_layer in zip(self._device_layers(), self._host_layers()):
            for of, to in zip(map(as_bits, of_layer), map(as_bits, to_layer)):
                staged, at = of.index_select(0, src), 0
                for first, n in runs:
                    to[first * P: (first + n) * P].copy_(staged[at: at + n * P],
                                                         non_blocking=True)
                    at += n * P

    def load_pages(self, hosts: list[int], pages: list[int]) -> None:
        """Copy host pages `hosts` back into device pages `pages`: per stored tensor, one
        copy per run of consecutive host pages into a device buffer (straight from the
        page-locked pages, queued), then one scatter into the device pages. (A gather on the
        host first made an unpinned temporary: a 32K prefix's 670 MB went through the CPU
        and a pageable copy.)"""
        runs, dst = self._plan(("from_host", tuple(hosts), tuple(pages)), hosts, pages)
        P = self.storage.page_tokens
        for of_layer, to_layer in zip(self._host_layers(), self._device_layers()):
            for of, to in zip(map(as_bits, of_layer), map(as_bits, to_layer)):
                staged = torch.empty((len(hosts) * P, *of.shape[1:]), dtype=of.dtype,
                                     device=to.device)
                at = 0
                for first, n in runs:
                    staged[at: at + n * P].copy_(of[first * P: (first + n) * P],
                                                 non_blocking=True)
                    at += n * P
                to.index_copy_(0, dst, staged)

    def _plan(self, op: tuple, hosts: list[int], pages: list[int]
              ) -> tuple[list[tuple[int, int]], torch.Tensor]:
        """A copy between `hosts` and `pages`, noted as `op` for tensor-parallel followers:
        its runs of consecutive host pages, and the device pages' token rows in host order
        (an index on the device)."""
        recorder = getattr(self, "recorder", None)
        if recorder is not None:
            recorder.ops.append(op)
        order, runs = _host_runs(hosts)
        P = self.storage.page_tokens
        rows = (torch.tensor([pages[i] for i in order])[:, None] * P + torch.arange(P)).flatten()
        return runs, to_device(rows, self.storage.device)  # page-locked: no host wait

    def release_page(self, host: int) -> None:
        self._free.append(host)

    def _device_layers(self) -> list[tuple[torch.Tensor, ...]]:
        return self.storage.stored()  # read now: an elastic pool regrows them

    def _host_layers(self) -> list[tuple[torch.Tensor, ...]]:
        return [*self.k, *self.v, *([(self.rows,)] if self.rows is not None else [])]


def _host_runs(hosts: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """The positions of `hosts` in host order, and its runs of consecutive host pages as
    (first page, pages)."""
    order = sorted(range(len(hosts)), key=hosts.__getitem__)
    runs, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or hosts[order[i]] != hosts[order[i - 1]] + 1:
            runs.append((hosts[order[start]], i - start))
            start = i
    return order, runs


def check_host_ram(needed: int, flags: str) -> None:
    """`NINFER_HOST_TIER_RAM_GUARD`: refuse tiers that do not fit in the RAM available now
    (`=0` skips the check)."""
    if os.environ.get("NINFER_HOST_TIER_RAM_GUARD", "1") == "0":
        return
    available = psutil.virtual_memory().available
    if needed > available:
        raise HostTierRamError(
            f"{flags}: the host KV/state tiers need {needed / GIB:.1f} GiB of RAM and "
            f"{available / GIB:.1f} GiB is available (NINFER_HOST_TIER_RAM_GUARD=0 skips this "
            "check)")
