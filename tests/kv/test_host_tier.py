"""The prefix cache's host tier (`kv.host_tier`) at the page level: what comes back is what went
out, whatever order the host pages were taken in."""
from __future__ import annotations

import torch

from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.kv.host_tier import HostTier

P = 8


def _save(tier: HostTier, pages: list[int]) -> list[int]:
    hosts = [tier.take_page() for _ in pages]
    tier.copy_out(pages, hosts)
    return hosts


def test_load_pages_restores_scattered_host_pages_into_any_device_pages():
    storage = KvStorage(PagePool(12, page_tokens=P), layers=2, heads=2, dim=16,
                        codecs=codecs_for("int8", torch.float32), activation_dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    for layer in (*storage.k, *storage.v):  # every component, codes and scales alike
        for t in layer:
            t.copy_(torch.randint(-100, 100, t.shape, generator=gen).to(t.dtype))
    before = [[t.clone() for t in layer] for layer in (*storage.k, *storage.v)]
    tier = HostTier(storage, pages=8)
    saved = [0, 5, 3, 4, 9]  # device pages, demoted in this order (host pages 0..4)
    hosts = _save(tier, saved)
    tier.release_page(hosts[1])  # a gap: the host pages left are two runs, 0 and 2..4
    hosts.pop(1), saved.pop(1)
    order = [2, 0, 3, 1]  # the path's order is not the host tier's
    targets = [11, 1, 7, 6]
    tier.load_pages([hosts[i] for i in order], targets)
    for layer, old in zip((*storage.k, *storage.v), before):
        for t, o in zip(layer, old):
            for i, dst in zip(order, targets):
                src = saved[i]
                assert torch.equal(t[dst * P: (dst + 1) * P], o[src * P: (src + 1) * P])


def test_drafter_rows_go_to_the_host_and_come_back_with_their_pages():
    storage = KvStorage(PagePool(6, page_tokens=P), layers=1, heads=1, dim=16,
                        codecs=codecs_for("bf16", torch.float32), activation_dtype=torch.float32,
                        row_width=12)
    storage.rows.copy_(torch.randn(storage.rows.shape))
    before = storage.rows.clone()
    tier = HostTier(storage, pages=4)
    assert tier.kv_bytes == 4 * storage.page_bytes  # the rows are in a host page's bytes
    hosts = _save(tier, [4, 1])
    tier.load_pages(hosts, [0, 5])
    assert torch.equal(storage.rows[0: P], before[4 * P: 5 * P])
    assert torch.equal(storage.rows[5 * P: 6 * P], before[P: 2 * P])
