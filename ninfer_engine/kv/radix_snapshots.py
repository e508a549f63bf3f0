"""How the prefix tree (`kv.radix`) keeps its recurrent-state snapshots (`kv.snapshot_policy`): a
new one takes a device slot, the lowest-standing snapshot there moving to a host slot or being
dropped; past a kind's limit the lowest of that kind goes the same way (long anchors: dropped).
`Snapshots` is a part of `PrefixTree`, apart only to keep each file to one concern: it reads
the tree's own fields."""
from __future__ import annotations

from .radix_nodes import Node
from .slots import StateSlot, copy_state
from .snapshot_policy import kind_class, least_valuable, long_anchors_on_path


class Snapshots:
    def _keep_snapshot(self, node: Node, state: StateSlot, now: int, kind: str) -> None:
        """A snapshot at `node`: a new one, or the one there saved again (fresher); the
        latest save names it."""
        if node.snapshot is None and node.host_snapshot is None:
            if not self._refused(kind):
                node.kind = kind
                self._snapshot(node, state)
        else:
            node.restored = now
            node.kind = kind

    def _cap(self, kind: str) -> int | None:
        limits = self.limits
        return {"long": limits.long_anchors, "shared": limits.shared,
                "private": limits.private}[kind_class(kind)]

    def _refused(self, kind: str) -> bool:
        """A limit of 0 for `kind` (and, for a device budget, no host tier): none is kept."""
        return self._cap(kind) == 0 and (kind_class(kind) == "long" or self.host_states is None)

    def _snapshot(self, node: Node, state: StateSlot) -> bool:
        """Copy `state` into a snapshot slot at `node` (`node.kind` set): a device slot, or a
        host slot when its kind has no device budget. False: kept nowhere."""
        if self.slots is None or self.slots.total == 0:
            return False
        node.restored, node.hits = self._tick(), 0
        cap, cls = self._cap(node.kind), kind_class(node.kind)
        if cls == "long" and cap is not None:  # before taking a slot: the path's own go first
            others = [n for n in long_anchors_on_path(node) if n is not node]
            while others and len(others) >= cap:
                victim = least_valuable(others)
                others.remove(victim)
                self._forget(victim)
        elif cap == 0:
            return self._to_host_slot(node, state)
        if not self.slots.free:
            self._off_device(least_valuable(self._snapshots))
        node.snapshot = self.slots.acquire(zeroed=False)  # overwritten next
        copy_state(state, node.snapshot)
        self._snapshots.add(node)
        if cls != "long" and cap is not None:
            same = [n for n in self._snapshots if n is not node and kind_class(n.kind) == cls]
            while same and len(same) >= cap:
                victim = least_valuable(same)
                same.remove(victim)
                self._off_device(victim)
        return True

    def _off_device(self, node: Node) -> None:
        """`node`'s device snapshot moves to a host slot, or is dropped."""
        if not self._snapshot_to_host(node):
            self._forget(node)

    def _to_host_slot(self, node: Node, state: StateSlot) -> bool:
        """Copy `state` into a host slot at `node` (the lowest host snapshot gives way); False
        without a host state tier."""
        states = self.host_states
        if states is None or states.total == 0:
            return False
        if not states.free:
            victim = least_valuable(self._host_snapshots)
            states.release(victim.host_snapshot)
            victim.host_snapshot = None
            self._host_snapshots.discard(victim)
            if victim.snapshot is None and len(victim.key) < self.page_tokens:
                self._remove(victim)  # a tail without its snapshot restores nothing
        node.host_snapshot = states.acquire(zeroed=False)  # overwritten next
        copy_state(state, node.host_snapshot)
        self._host_snapshots.add(node)
        return True

    def _snapshot_to_host(self, node: Node) -> bool:
        """Move `node`'s device snapshot to a host slot; False without a host state tier."""
        if not self._to_host_slot(node, node.snapshot):
            return False
        self.slots.release(node.snapshot)
        node.snapshot = None
        self._snapshots.discard(node)
        return True

    def _forget(self, node: Node) -> None:
        """Drop `node`'s snapshots; a tail goes with them (it would restore nothing)."""
        self._drop_snapshot(node)
        if len(node.key) < self.page_tokens:
            self._remove(node)

    def _drop_snapshot(self, node: Node) -> None:
        if node.snapshot is not None:
            self.slots.release(node.snapshot)
            node.snapshot = None
            self._snapshots.discard(node)
        if node.host_snapshot is not None:
            self.host_states.release(node.host_snapshot)
            node.host_snapshot = None
            self._host_snapshots.discard(node)
