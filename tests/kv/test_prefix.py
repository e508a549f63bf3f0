"""The prefix tree (`kv.radix`) and `SequenceMemory` at the memory level: what a hit restores,
copy-free sharing, LRU eviction of unreferenced leaves, snapshots, and no leaks."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.kv import KvStorage, PagePool, PrefixTree, SequenceMemory, StatePool
from ninfer_engine.kv import codecs_for

P = 8  # tokens a page
LAYOUT = [{"ssm": ((2,), torch.float32)}]


def _storage(pages=16) -> KvStorage:
    return KvStorage(PagePool(pages, page_tokens=P), layers=1, heads=1, dim=16,
                     codecs=codecs_for("bf16", torch.float32), activation_dtype=torch.float32)


def _state(value: float):
    slot = StatePool(1, LAYOUT, "cpu", SimpleNamespace).acquire()
    slot.layers[0].ssm.fill_(value)
    return slot


def _written(storage, tokens):
    """A cache holding `tokens`' K/V (row i = i + 1), its lease covering one more page."""
    cache = storage.new_cache()
    assert cache.reserve(len(tokens) + P)
    rows = torch.arange(1, len(tokens) + 1, dtype=torch.float32)[:, None, None].expand(-1, 1, 16)
    cache.write(0, 0, rows, -rows)
    return cache


def test_identical_prompt_shares_full_pages_and_copies_the_partial_one():
    storage = _storage()
    tree = PrefixTree(storage)
    tokens = tuple(range(20))
    source = _written(storage, tokens)
    tree.insert(tokens, source.pages, hand_over=True)  # a finished answer
    pages = source.pages[:3]
    assert tree.pages == 3 and tree.held_pages() == set(pages)
    source.release()
    assert storage.allocator.used == 3  # the tree's pages outlive their writer, uncopied
    hit = tree.match(tokens)  # the same prompt again: all but its last token
    assert hit.tokens == 19 and len(hit.pages) == 2 and hit.copy[1] == 3
    assert tree.match(tokens[:12] + (99,) * 9).tokens == 12  # an edit mid-page
    assert tree.match((99,) + tokens).tokens == 0
    longer = tree.match(tokens + (5, 6))
    assert longer.tokens == 20 and longer.pages == tuple(pages[:2]) and longer.copy == (pages[2], 4)
    tree.clear()
    assert storage.allocator.free == storage.allocator.total


def test_hybrid_hits_restore_the_deepest_snapshot_only():
    storage = _storage()
    tree = PrefixTree(storage, StatePool(3, LAYOUT, "cpu", SimpleNamespace))
    tokens = tuple(range(30))
    source = _written(storage, tokens)
    tree.insert(tokens[:16], source.pages, _state(16.0))  # a snapshot boundary (2 pages)
    tree.insert(tokens[:27], source.pages, _state(27.0))  # the prompt end: tail copied
    assert tree.snapshots == 2 and tree.pages == 4  # 3 shared full pages, 1 copied tail
    hit = tree.match(tokens[:27] + (1,))
    assert hit.tokens == 27 and len(hit.pages) == 3 and hit.copy[1] == 3
    assert hit.snapshot.layers[0].ssm[0] == 27.0
    hit = tree.match(tokens[:26] + (1, 2))  # past the 16-token snapshot, short of the tail
    assert hit.tokens == 16 and len(hit.pages) == 2 and hit.copy is None
    assert hit.snapshot.layers[0].ssm[0] == 16.0
    assert tree.match(tokens[:16]).tokens == 0  # the last token is always computed
    # a fourth snapshot: the lowest standing gives way (last save or restore, plus a bonus
    # for each restore: `kv.snapshot_policy`), here 8, saved after both restores
    tree.insert(tokens[:8], source.pages, _state(8.0))
    tree.insert(tokens[:24], source.pages, _state(24.0))  # 8 goes: its node stays
    assert tree.snapshots == 3 and tree.pages == 4
    assert tree.match(tokens[:12] + (1,)).tokens == 0
    assert tree.match(tokens[:20] + (1,)).tokens == 16
    # 24, never restored, goes before 16 and 27 (restored, older) and before the new 19
    tree.insert(tokens[:19], source.pages, _state(19.0))
    assert tree.snapshots == 3 and tree.pages == 5
    assert tree.match(tokens[:25] + (1,)).tokens == 19
    assert tree.match(tokens[:27] + (1,)).tokens == 27
    source.release()
    assert tree.evict(100) == 5 and tree.pages == 0 and tree.slots.free == 3
    assert storage.allocator.free == storage.allocator.total


def test_eviction_takes_unreferenced_leaves_least_recently_used_first():
    storage = _storage(pages=6)
    tree = PrefixTree(storage)
    a, b = (1,) * 16 + (2,), (1,) * 8 + (3,) * 8 + (4,)
    for tokens in (a, b):
        cache = _written(storage, tokens)
        tree.insert(tokens, cache.pages)
        cache.release()
    assert tree.pages == 3 and storage.allocator.free == 3
    tree.match(a)  # b's last page is now the least recently used leaf
    reader = storage.new_cache()
    storage.allocator.share(reader, list(tree.match(a).pages))  # a running request reads a
    assert tree.evict(10) == 1  # b's leaf; a's pages are referenced, the root page a parent
    assert tree.match(b).tokens == 8 and tree.match(a).tokens == 16
    checks, evictable = [], tree._evictable
    tree._evictable = lambda *args: checks.append(1) or evictable(*args)
    assert tree.evict(10) == 0 and not checks  # no page changed hands: nothing looked at
    reader.release()
    assert tree.evict(10) == 2 and storage.allocator.free == 6
    assert len(checks) == 3  # the one leaf, then its parent, then the root: no walk


def _seq(prompt, max_tokens=8):
    return SimpleNamespace(prompt=prompt, prefix_key=prompt, output=[], cached=0, reused=0,
                           cache=None, state=None,
                           request=SimpleNamespace(max_tokens=max_tokens, anchors=(),
                                                   prompt_logprobs=None), id="s")


def test_admission_evicts_tree_pages_before_waiting():
    storage = _storage(pages=4)
    memory = SequenceMemory(storage, lease_window=8, max_running=2, checkpoint_slots=4,
                            prefix_reuse=True, kv_dtype="bf16")
    first = _seq(tuple(range(16)))
    assert memory.admit(first) and len(first.cache.pages) == 3
    first.cached = 16
    memory.checkpoint(first)  # full pages only: shared, nothing copied
    memory.release(first)
    assert storage.allocator.used == 2
    again = _seq(tuple(range(16)) + (5, 6))
    assert memory.admit(again) and again.reused == 16 and again.cached == 16
    other = _seq(tuple(range(100, 110)))
    # the pool is full and `again` reads the tree's pages: nothing to evict, the request waits
    assert not memory.admit(other) and memory.prefix.pages == 2
    memory.release(again)
    assert memory.admit(other) and other.reused == 0 and memory.prefix.pages == 1
    assert memory.prefix_stats().hit_tokens == 16 and memory.prefix_stats().evicted_pages == 1
    memory.release(other)
    memory.forget_prefixes()  # what the engine does after its startup warm-up
    assert storage.allocator.free == 4 and memory.prefix_stats().lookups == 0


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


def test_hybrid_chunks_end_on_snapshot_points():
    """Prefill chunks of a hybrid prompt end on every `snapshot_tokens` boundary and one token
    before the prompt's end (the state exists only where a chunk ends); llama chunks are not
    cut."""
    pool = lambda n: StatePool(n, LAYOUT, "cpu", SimpleNamespace)  # noqa: E731
    hybrid = SequenceMemory(_storage(), lease_window=8, max_running=1, checkpoint_slots=2,
                            prefix_reuse=True, kv_dtype="bf16", state_pool=pool,
                            snapshot_tokens=16)
    llama = SequenceMemory(_storage(), lease_window=8, max_running=1, checkpoint_slots=2,
                           prefix_reuse=True, kv_dtype="bf16", snapshot_tokens=16)
    seq = _seq(tuple(range(40)))
    cuts = []
    for cached, tokens in ((0, 16), (16, 16), (32, 8), (39, 1), (10, 16), (20, 16), (30, 10)):
        seq.cached = cached
        cuts.append(hybrid.chunk_tokens(seq, tokens))
        assert llama.chunk_tokens(seq, tokens) == tokens
    assert cuts == [16, 16, 7, 1, 6, 12, 2]


def test_a_running_request_grows_into_idle_tree_pages_before_ending_with_length():
    storage = _storage(pages=5)
    memory = SequenceMemory(storage, lease_window=1, max_running=3, checkpoint_slots=0,
                            prefix_reuse=True, kv_dtype="bf16")
    done = _seq(tuple(range(16)))
    assert memory.admit(done)
    done.cached = 16
    memory.checkpoint(done)
    memory.release(done)  # its two pages stay in the tree, idle
    held, running = _seq((6,) * 7), _seq((7,) * 7)
    assert memory.admit(held) and memory.admit(running) and storage.allocator.free == 1
    assert memory.grow(running, 16) and memory.prefix.pages == 2  # the free page first
    assert memory.grow(running, 24) and memory.prefix.pages == 1  # then the tree's leaf
    assert memory.grow(running, 32) and memory.prefix.pages == 0
    assert memory.prefix_stats().evicted_pages == 2
    assert not memory.grow(running, 40)  # `held`'s page is not the tree's: `length`
