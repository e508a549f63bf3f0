"""`PageTables`: the decode step's device page table, refilled only where a row changed."""
from __future__ import annotations

import torch

from ninfer_engine.kv import KvStorage, PagePool, PageTables, codecs_for


def _storage() -> KvStorage:
    return KvStorage(PagePool(16, page_tokens=8), layers=1, heads=1, dim=16,
                     codecs=codecs_for("bf16", torch.float32), activation_dtype=torch.float32)


def test_rows_follow_their_caches_through_growth_and_reordering():
    storage = _storage()
    a, b, c = storage.new_cache(), storage.new_cache(), storage.new_cache()
    for cache, tokens in ((a, 8), (b, 16), (c, 8)):
        assert cache.reserve(tokens)
    table = torch.full((3, 4), -1, dtype=torch.long)
    tables = PageTables(table)

    def check(caches):
        for row, cache in enumerate(caches):
            assert table[row, : len(cache.pages)].tolist() == cache.pages

    tables.fill([a, b])
    check([a, b])
    assert table[2].tolist() == [-1] * 4  # no row 2 yet
    assert a.reserve(24)  # a grows by two pages: row 0 gets them
    tables.fill([a, b])
    check([a, b])
    tables.fill([c, a, b])  # another order: every row names another cache now
    check([c, a, b])
    table[1].fill_(-7)  # a row that did not change is not copied again...
    tables.fill([c, a, b])
    assert table[1].tolist() == [-7] * 4
    assert b.reserve(32)  # ...and one that grew gets only its new pages
    tables.fill([c, a, b])
    assert table[2].tolist() == b.pages
