"""`PagePool` invariants: all-or-nothing leases, growth, sharing with reference counts."""
from __future__ import annotations

import random

import pytest

from ninfer_engine.kv import PagePool, pages_for


def _check(pool: PagePool, owners: list) -> None:
    """Free + distinct referenced pages = total; no page is both free and in a table."""
    referenced = {p for o in owners for p in pool.table(o)}
    assert pool.free + len(referenced) == pool.total
    assert pool.used == len(referenced)
    assert not referenced & set(pool._free)


def test_lease_grow_release():
    pool = PagePool(4, page_tokens=64)
    assert pool.lease("a", 65) and pool.table("a") == [0, 1]
    assert pool.grow("a", 128) and len(pool.table("a")) == 2  # already covered
    assert pool.lease("b", 1) and pool.free == 1
    assert not pool.grow("a", 64 * 4)  # needs two more, one is free: nothing changes
    assert len(pool.table("a")) == 2 and pool.free == 1
    assert not pool.lease("c", 200) and pool.table("c") == [] and pool.owners() == 2
    pool.release("a")
    assert pool.free == 3 and pool.table("a") == []
    pool.release("b")
    assert pool.free == 4 and pool.owners() == 0


def test_shared_pages_free_with_the_last_reference():
    pool = PagePool(3, page_tokens=8)
    assert pool.lease("req", 20)
    full = pool.table("req")[:2]
    pool.share("ckpt", full)
    pool.release("req")
    assert pool.free == 1 and pool.table("ckpt") == full  # the checkpoint keeps them alive
    pool.share("next", full)
    assert pool.lease("next", 24) and pool.free == 0
    pool.release("ckpt")
    assert pool.free == 0
    pool.release("next")
    assert pool.free == 3
    with pytest.raises(ValueError):
        pool.share("x", [0])  # a free page cannot be shared


def test_random_operations_keep_the_books():
    rng = random.Random(0)
    pool = PagePool(32, page_tokens=16)
    owners: list[int] = []
    for step in range(2000):
        op = rng.random()
        if op < 0.4:
            owner, tokens = step, rng.randint(1, 200)
            if pool.lease(owner, tokens):
                owners.append(owner)
                assert len(pool.table(owner)) == pages_for(tokens, 16)
        elif op < 0.6 and owners:
            owner = rng.choice(owners)
            before = len(pool.table(owner))
            grown = pool.grow(owner, (before + rng.randint(0, 3)) * 16)
            assert grown or len(pool.table(owner)) == before
        elif op < 0.75 and owners:
            source = pool.table(rng.choice(owners))
            shared = source[: rng.randint(0, len(source))]
            pool.share(step, shared)
            owners.append(step)
        elif owners:
            pool.release(owners.pop(rng.randrange(len(owners))))
        _check(pool, owners)
    for owner in owners:
        pool.release(owner)
    assert pool.free == pool.total and pool.owners() == 0
