"""`ElasticPagePool` (`--elastic`): growth in whole steps up to the capacity, storage that
keeps its contents across growth, and the same bookkeeping invariants as a fixed pool."""
from __future__ import annotations

import random

import pytest
import torch

from ninfer_engine.kv import KV_DTYPES, ElasticPagePool, KvStorage, codecs_for, pages_for


def test_grows_by_whole_steps_never_past_capacity():
    pool = ElasticPagePool(capacity=10, step=4, page_tokens=8)
    grown: list[int] = []
    pool.on_grow(grown.append)
    assert (pool.total, pool.capacity) == (4, 10)
    assert pool.lease("a", 3 * 8) and pool.total == 4  # fits the first step
    assert pool.lease("b", 3 * 8) and pool.total == 8  # one step more
    assert not pool.lease("c", 5 * 8)  # 2 free + 2 to the cap < 5: nothing grows
    assert pool.total == 8 and pool.table("c") == [] and grown == [8]
    assert pool.lease("c", 4 * 8) and pool.total == 10 and pool.free == 0  # capped step
    assert not pool.grow("a", 4 * 8) and pool.total == 10
    assert grown == [8, 10]
    for owner in "abc":
        pool.release(owner)
    assert pool.free == pool.total == 10  # the pool does not shrink


def test_capacity_below_one_step():
    assert ElasticPagePool(capacity=3, step=8).total == 3


def test_a_refused_growth_fails_the_lease_and_changes_nothing():
    pool = ElasticPagePool(capacity=8, step=2, page_tokens=8)

    def no_room(pages: int) -> None:
        raise MemoryError("device full")

    pool.on_grow(no_room)
    assert pool.lease("a", 16) and not pool.lease("b", 8)
    assert (pool.total, pool.free, pool.table("b")) == (2, 0, [])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_storage_keeps_its_contents_when_the_pool_grows(kv_dtype):
    pool = ElasticPagePool(capacity=6, step=2, page_tokens=4)
    storage = KvStorage(pool, layers=2, heads=2, dim=32,
                        codecs=codecs_for(kv_dtype, torch.float32),
                        activation_dtype=torch.float32)
    page_bytes = storage.nbytes // 2
    assert storage.page_bytes == page_bytes
    first, second = storage.new_cache(), storage.new_cache()
    assert first.reserve(8)
    k, v = torch.randn(8, 2, 32), torch.randn(8, 2, 32)
    for layer in range(2):
        first.write(layer, 0, k * (layer + 1), v * (layer + 1))
    before = [first.read(layer, 8) for layer in range(2)]
    assert second.reserve(12) and pool.total == 6  # 3 pages more: two steps, capped at 6
    assert storage.nbytes == 6 * page_bytes
    second.write(1, 0, torch.randn(12, 2, 32), torch.randn(12, 2, 32))
    for layer in range(2):
        after = first.read(layer, 8)
        assert torch.equal(after[0], before[layer][0]) and torch.equal(after[1], before[layer][1])


def test_random_operations_with_growth_keep_the_books():
    rng = random.Random(1)
    pool = ElasticPagePool(capacity=30, step=4, page_tokens=16)
    owners: list[int] = []
    sizes = {pool.total}
    for step in range(2000):
        op = rng.random()
        if op < 0.4:
            owner, tokens = step, rng.randint(1, 200)
            if pool.lease(owner, tokens):
                owners.append(owner)
                assert len(pool.table(owner)) == pages_for(tokens, 16)
            else:  # refused only when even the full capacity could not cover it
                assert pages_for(tokens, 16) > pool.free + pool.capacity - pool.total
        elif op < 0.6 and owners:
            owner = rng.choice(owners)
            before = len(pool.table(owner))
            grown = pool.grow(owner, (before + rng.randint(0, 3)) * 16)
            assert grown or len(pool.table(owner)) == before
        elif op < 0.75 and owners:
            source = pool.table(rng.choice(owners))
            pool.share(step, source[: rng.randint(0, len(source))])
            owners.append(step)
        elif owners:
            pool.release(owners.pop(rng.randrange(len(owners))))
        referenced = {p for o in owners for p in pool.table(o)}
        assert pool.free + len(referenced) == pool.total and not referenced & set(pool._free)
        assert pool.total % pool.step == 0 or pool.total == pool.capacity
        sizes.add(pool.total)
    for owner in owners:
        pool.release(owner)
    assert pool.free == pool.total == pool.capacity and pool.owners() == 0
    assert len(sizes) > 2  # it grew several times on the way to its capacity


def test_lent_pages_come_back_before_a_growth_and_never_fail_a_lease():
    """Capacity not grown into is lent (the expert-slot cache); a growth that needs it asks
    the borrower for the shortfall first, and grows no further than what is not lent."""
    pool = ElasticPagePool(capacity=10, step=2, page_tokens=8)
    returned: list[int] = []

    def give_back(pages: int) -> int:  # a borrower that returns whole units of 3 pages
        units = min(-(-pages // 3), pool.lent // 3)
        returned.append(units * 3)
        return units * 3

    assert pool.lend_room() == 8
    pool.lend(6, give_back)
    assert (pool.lent, pool.lend_room()) == (6, 2)
    with pytest.raises(ValueError, match="cannot lend 3 pages"):
        pool.lend(3, give_back)
    assert pool.lease("a", 4 * 8) and pool.total == 4 and returned == []  # room was enough
    assert pool.lease("b", 3 * 8) and returned == [3]  # 1 short of room: one unit back
    assert (pool.total, pool.lent) == (7, 3) and pool.total + pool.lent <= pool.capacity
    assert pool.lease("c", 3 * 8) and returned == [3, 3] and (pool.total, pool.lent) == (10, 0)
    assert not pool.lease("d", 8) and returned == [3, 3]  # nothing lent is left to ask for


def test_drafter_rows_follow_their_slots_through_growth_and_tail_copies():
    """A storage with drafter rows (`row_width`): a cache's rows survive the pool's growth, and
    `copy_slots` copies a page's rows with its K/V."""
    pool = ElasticPagePool(capacity=6, step=2, page_tokens=4)
    storage = KvStorage(pool, layers=1, heads=1, dim=8, codecs=codecs_for("bf16", torch.float32),
                        activation_dtype=torch.float32, row_width=5)
    first, second = storage.new_cache(), storage.new_cache()
    assert first.reserve(8)
    rows = torch.randn(8, 5)
    first.write_rows(0, rows)
    assert second.reserve(12) and pool.total == 6 and storage.rows.shape == (24, 5)
    assert torch.equal(first.read_rows(8), rows)
    storage.copy_slots(first.pages[1], second.pages[0], 3)  # a tail's first 3 slots
    assert torch.equal(second.read_rows(3), rows[4:7])
