"""`StatePool`: a slot handed out again starts from zero in every field of every layer, stacked
or not, and leaves the other slots as they were."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.kv.slots import StatePool, copy_state

# conv and ssm alike in both layers (stacked), `extra` only in the second (a tensor of its own)
LAYOUT = [{"conv": ((3, 4), torch.bfloat16), "ssm": ((2, 2), torch.float32)},
          {"conv": ((3, 4), torch.bfloat16), "ssm": ((2, 2), torch.float32),
           "extra": ((5,), torch.float32)}]


def test_a_slot_acquired_again_is_zeroed_and_its_neighbours_are_kept():
    pool = StatePool(3, LAYOUT, "cpu", SimpleNamespace)
    slots = [pool.acquire() for _ in range(3)]
    for i, slot in enumerate(slots):
        for t in slot.tensors():
            t.fill_(i + 1)
    assert pool.stack("conv") is not None and pool.stack("extra") is None
    pool.release(slots[1])
    again = pool.acquire()
    assert again.index == slots[1].index
    assert len(again.tensors()) == 5 and all(bool((t == 0).all()) for t in again.tensors())
    for i in (0, 2):
        assert all(bool((t == i + 1).all()) for t in slots[i].tensors())


def test_a_slot_the_caller_overwrites_is_not_zeroed():
    pool = StatePool(1, LAYOUT, "cpu", SimpleNamespace)
    slot = pool.acquire()
    for t in slot.tensors():
        t.fill_(7)
    pool.release(slot)
    assert all(bool((t == 7).all()) for t in pool.acquire(zeroed=False).tensors())


def test_a_state_copied_between_pools_of_one_layout_lands_in_its_row_alone():
    """A snapshot (the prefix tree's pool) and a restore (back into a running slot): every
    field of every layer, stacked or not, and no other row."""
    running, snapshots = (StatePool(n, LAYOUT, "cpu", SimpleNamespace) for n in (3, 2))
    src = [running.acquire() for _ in range(3)][1]
    for k, t in enumerate(src.tensors()):
        t.copy_(torch.arange(t.numel(), dtype=t.dtype).view(t.shape) + k)
    kept = snapshots.acquire()
    for t in kept.tensors():
        t.fill_(-1)
    dst = snapshots.acquire()
    copy_state(src, dst)
    assert all(torch.equal(a, b) for a, b in zip(dst.tensors(), src.tensors()))
    assert all(bool((t == -1).all()) for t in kept.tensors())
    back = running.slot(0)
    copy_state(dst, back)
    assert all(torch.equal(a, b) for a, b in zip(back.tensors(), src.tensors()))

