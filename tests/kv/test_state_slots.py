"""`StatePool`: a slot handed out again starts from zero in every field of every layer, stacked
or not, and leaves the other slots as they were."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ninfer_engine.kv.slots import StatePool

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
