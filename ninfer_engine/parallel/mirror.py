"""The prefix cache at `--tp` > 1: rank 0's tree decides, every rank copies.

The tree (`kv.radix`, `kv.memory`) moves data in four ways only: a page's first slots into
another page (`KvStorage.copy_slots`), a recurrent state between the running, snapshot and
host-snapshot pools (`slots.copy_state`), a device page to a host page and host pages back
(`HostTier.copy_out` / `load_pages`). On rank 0 a `Recorder` notes each one by page and slot
ids; the next step's plan carries them, and a follower `replay`s them on its own share before
the step, in the same order. Its pools have the same sizes (the same memory plan), so the ids
name the same places, and no copy can be overtaken by a step's writes: rank 0 makes them
between its steps.
"""
from __future__ import annotations

from typing import Any

from ..kv.slots import copy_state


def _pools(memory: Any) -> dict[str, Any]:
    """The state pools a copy goes between, by name."""
    tree = memory.prefix
    pools = {"running": memory.running_slots, "snapshot": memory.snapshot_slots,
             "host": tree.host_states if tree is not None else None}
    return {name: pool for name, pool in pools.items() if pool is not None}


def _host(memory: Any) -> Any:
    tree = memory.prefix
    return None if tree is None else tree.host


class Recorder:
    """Rank 0's copies since the last plan (`drain`)."""

    def __init__(self, memory: Any) -> None:
        self.ops: list[tuple] = []
        self._names = {id(pool): name for name, pool in _pools(memory).items()}
        for pool in _pools(memory).values():
            pool.recorder = self
        memory.storage.recorder = self
        if _host(memory) is not None:
            _host(memory).recorder = self

    def copy_state(self, src: Any, dst: Any) -> None:
        self.ops.append(("state", self._names[id(src.pool)], src.index,
                         self._names[id(dst.pool)], dst.index))

    def drain(self) -> tuple[tuple, ...]:
        ops, self.ops = tuple(self.ops), []
        return ops


def replay(memory: Any, ops: tuple[tuple, ...]) -> None:
    """Rank 0's copies, on this rank's pages and slots."""
    pools = _pools(memory) if ops else {}
    for op in ops:
        kind = op[0]
        if kind == "slots":
            memory.storage.copy_slots(*op[1:])
        elif kind == "state":
            _, src, i, dst, j = op
            copy_state(pools[src].slot(i), pools[dst].slot(j))
        elif kind == "to_host":
            _host(memory).copy_out(list(op[1]), list(op[2]))
        elif kind == "from_host":
            _host(memory).load_pages(list(op[1]), list(op[2]))
        else:
            raise ValueError(f"unknown copy {kind!r} from rank 0")
