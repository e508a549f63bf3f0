"""The prefix tree's snapshot policy (`kv.snapshot_policy`): a long prompt's chunk snapshots no
longer push out other conversations' end snapshots, and the per-kind limits."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.kv import KvStorage, PagePool, PrefixTree, StatePool, codecs_for
from ninfer_engine.kv.host_tier import HostTier
from ninfer_engine.kv.snapshot_policy import LONG_ANCHOR, REPLAY, SnapshotLimits

P = 8
LAYOUT = [{"ssm": ((2,), torch.float32)}]


def _tree(slots: int, limits: SnapshotLimits, host_slots: int = 0):
    storage = KvStorage(PagePool(64, page_tokens=P), layers=1, heads=1, dim=4,
                        codecs=codecs_for("bf16", torch.float32), activation_dtype=torch.float32)
    snapshots = StatePool(slots, LAYOUT, "cpu", SimpleNamespace)
    host = HostTier(storage, 4, snapshots.host_copy(host_slots, pinned=False)) if host_slots \
        else None
    return storage, PrefixTree(storage, snapshots, host, limits)


def _state(value: float):
    slot = StatePool(1, LAYOUT, "cpu", SimpleNamespace).acquire()
    slot.layers[0].ssm.fill_(value)
    return slot


def _prompt(storage, first: int, n: int):
    tokens = tuple(range(first, first + n))
    cache = storage.new_cache()
    assert cache.reserve(n + P)
    return tokens, cache


def _flood(limits: SnapshotLimits) -> list[int]:
    """Two short prompts' end snapshots, then a 10-chunk prompt snapshotted at every chunk and
    at its end, through 6 snapshot slots: what the two short prompts' next turns restore."""
    storage, tree = _tree(6, limits)
    short = [_prompt(storage, 100 * i, 13) for i in (1, 2)]
    for tokens, cache in short:
        tree.insert(tokens[:12], cache.pages, _state(1.0), kind=REPLAY)
    tokens, cache = _prompt(storage, 1000, 10 * 2 * P + 5)
    for chunk in range(1, 11):
        tree.insert(tokens[: chunk * 2 * P], cache.pages, _state(2.0), kind=LONG_ANCHOR)
    tree.insert(tokens[:-1], cache.pages, _state(3.0), kind=REPLAY)
    return [tree.match(t + (7,)).tokens for t, _ in short]


def test_a_long_prompts_chunk_snapshots_leave_other_prompts_end_snapshots():
    assert _flood(SnapshotLimits(long_anchors=2)) == [12, 12]
    assert _flood(SnapshotLimits()) == [0, 0]  # unbounded chunk snapshots push both out


def test_a_restored_snapshot_outlives_newer_ones():
    """Two slots: a (restored once), then b, c, d saved; plain LRU would keep c and d."""
    storage, tree = _tree(2, SnapshotLimits())
    prompts = [_prompt(storage, 100 * i, 13) for i in (1, 2, 3, 4)]
    (a, cache), rest = prompts[0], prompts[1:]
    tree.insert(a[:12], cache.pages, _state(1.0), kind=REPLAY)
    assert tree.match(a[:12] + (7,)).tokens == 12
    for tokens, cache in rest:
        tree.insert(tokens[:12], cache.pages, _state(1.0), kind=REPLAY)
    assert [tree.match(t[:12] + (7,)).tokens for t, _ in prompts] == [12, 0, 0, 12]


def test_the_private_device_budget_moves_the_lowest_to_the_host_tier():
    for host_slots, want in ((2, [12, 12, 12]), (0, [0, 12, 12])):
        storage, tree = _tree(6, SnapshotLimits(private=2), host_slots)
        prompts = [_prompt(storage, 100 * i, 13) for i in (1, 2, 3)]
        for tokens, cache in prompts:
            tree.insert(tokens[:12], cache.pages, _state(1.0), kind=REPLAY)
        assert tree.snapshots == 2 and tree.host_snapshots == (1 if host_slots else 0)
        assert [tree.match(t[:12] + (7,)).tokens for t, _ in prompts] == want


def test_a_limit_of_zero_keeps_none_of_that_kind():
    storage, tree = _tree(6, SnapshotLimits(long_anchors=0))
    tokens, cache = _prompt(storage, 1, 4 * P + 3)
    tree.insert(tokens[: 2 * P], cache.pages, _state(2.0), kind=LONG_ANCHOR)
    tree.insert(tokens[: 4 * P + 2], cache.pages, _state(3.0), kind=REPLAY)
    assert tree.snapshots == 1
    assert tree.match(tokens[: 3 * P] + (7,)).tokens == 0


def test_snapshots_in_reused_slots_hold_exactly_the_state_saved():
    """Snapshot slots, device and host, are not zeroed when taken (the save overwrites them):
    after every slot has held another state, each match still returns the one saved there."""
    storage, tree = _tree(2, SnapshotLimits(private=2), host_slots=2)
    prompts = [_prompt(storage, 100 * i, 13) for i in range(1, 7)]
    for value, (tokens, cache) in enumerate(prompts, 1):  # 6 saves through 2 + 2 slots
        tree.insert(tokens[:12], cache.pages, _state(float(value)), kind=REPLAY)
    kept = {}
    for value, (tokens, _) in enumerate(prompts, 1):
        match = tree.match(tokens[:12] + (7,))
        if match.snapshot is not None:
            kept[value] = match.snapshot.layers[0].ssm.tolist()
    assert len(kept) == 4  # the two newest on the device, the two before them on the host
    assert kept == {v: [float(v)] * 2 for v in kept}
