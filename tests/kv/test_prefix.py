"""Prefix checkpoints: K/V survive the source, partial pages are private, LRU eviction."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.kv import KvStorage, PagePool, PrefixCache, SequenceMemory, StatePool
from ninfer_engine.kv import codecs_for


def _storage(pages=8) -> KvStorage:
    return KvStorage(PagePool(pages, page_tokens=8), layers=1, heads=1, dim=16,
                     codecs=codecs_for("bf16", torch.float32), activation_dtype=torch.float32)


def _rows(n, seed):
    return torch.randn(n, 1, 16, generator=torch.Generator().manual_seed(seed))


def test_checkpoint_outlives_its_source_and_restores_exactly():
    storage = _storage()
    prefix = PrefixCache(storage, None, capacity=2)
    tokens, k = tuple(range(20)), _rows(24, 0)
    source = storage.new_cache()
    assert source.reserve(24)
    source.write(0, 0, k[:20], -k[:20])
    assert prefix.save(tokens, source, None)
    ckpt = prefix.checkpoints[0]
    assert ckpt.pages[:2] == source.pages[:2] and ckpt.pages[2] != source.pages[2]
    source.write(0, 20, k[20:], -k[20:])  # the source keeps writing into its partial page
    source.release()
    assert storage.allocator.used == 3
    assert prefix.match(tokens) is None  # only a strict prefix is reused
    assert prefix.match(tokens + (99,)) is ckpt
    restored = storage.new_cache()
    prefix.restore(ckpt, restored)
    assert storage.allocator.lease(restored, 30)
    prefix.copy_partial(ckpt, restored)
    keys, values = restored.read(0, 20)
    assert torch.equal(keys, k[:20]) and torch.equal(values, -k[:20])
    restored.release()
    prefix.clear()
    assert storage.allocator.free == storage.allocator.total


def test_lru_eviction_by_count_and_by_state_slots():
    storage = _storage()
    layout = [{"ssm": ((2,), torch.float32)}]
    slots = StatePool(2, layout, "cpu", SimpleNamespace)
    prefix = PrefixCache(storage, slots, capacity=3)
    cache = storage.new_cache()
    assert cache.reserve(16)
    state = StatePool(1, layout, "cpu", SimpleNamespace).acquire()
    state.layers[0].ssm.fill_(1.0)
    assert prefix.save((1,) * 8, cache, state)
    assert prefix.save((2,) * 8, cache, state)
    prefix.match((1,) * 9)  # touch the first: the second is now least recently used
    assert prefix.save((3,) * 8, cache, state)  # two state slots: one must go
    assert [c.tokens[0] for c in prefix.checkpoints] == [1, 3]
    assert torch.equal(prefix.checkpoints[1].state.layers[0].ssm, torch.ones(2))
    assert slots.free == 0
    cache.release()
    prefix.clear()
    assert slots.free == 2 and storage.allocator.free == storage.allocator.total


def test_admission_evicts_checkpoints_before_waiting():
    storage = _storage(pages=4)
    memory = SequenceMemory(storage, lease_window=8, max_running=2, checkpoint_slots=4,
                            prefix_reuse=True, kv_dtype="bf16")

    def seq(prompt, max_tokens=8):
        return SimpleNamespace(prompt=prompt, output=[], cached=0, cache=None, state=None,
                               request=SimpleNamespace(max_tokens=max_tokens), id="s")

    first = seq(tuple(range(16)))
    assert memory.admit(first) and len(first.cache.pages) == 3
    first.cached = 16
    memory.checkpoint(first)  # full pages only: shared, nothing copied
    memory.release(first)
    assert storage.allocator.used == 2
    again = seq(tuple(range(16)) + (5, 6))
    assert memory.admit(again) and again.reused == 16 and again.cached == 16
    other = seq(tuple(range(100, 110)))
    # the pool is full (`again` holds the checkpoint's pages too): pressure evicts the
    # checkpoint first, and the request still waits
    assert not memory.admit(other) and len(memory.prefix) == 0
    memory.release(again)
    assert memory.admit(other) and other.reused == 0


def test_state_pool_slots_are_rows_of_one_tensor_per_field():
    """A slot's state objects are views of its rows: writes through them land in the pool
    tensor the decode step indexes, a slot comes back zeroed, and `copy_state` copies rows."""
    from ninfer_engine.kv.slots import copy_state

    layout = [{"conv": ((2, 3), torch.bfloat16), "ssm": ((2, 2), torch.float32)}] * 2
    pool = StatePool(3, layout, "cpu", SimpleNamespace)
    a, b = pool.acquire(), pool.acquire()
    assert (a.index, b.index, pool.free) == (0, 1, 1)
    a.layers[1].ssm.add_(5.0)
    assert torch.equal(pool.field("ssm")[1][0], torch.full((2, 2), 5.0))
    copy_state(a, b)
    assert torch.equal(pool.field("ssm")[1][1], torch.full((2, 2), 5.0))
    pool.release(a)
    again = pool.acquire()
    assert again.index == 0 and not any(t.any() for t in again.tensors())
    assert pool.acquire().index == 2 and pool.acquire() is None
