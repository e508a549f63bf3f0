"""How the prefix tree (`kv.radix`) moves pages and snapshots between the device and its host
tier (`kv.host_tier`): a device leaf's page demoted to a host page when the pool needs it, host
pages restored for a hit (or adopted from a request that computed the same tokens), a
snapshot that loses its device slot moved to a host slot. `HostMoves` is a part of
`PrefixTree`, apart only to keep each file to one concern: it reads the tree's own fields."""
from __future__ import annotations

from .radix_nodes import Node, Plan
from .slots import copy_state


class HostMoves:
    def _restore(self, plan: Plan) -> bool:
        """Copy the plan's host pages back into device pages; False if the pool ran short."""
        nodes = [*plan.path, *([plan.tail] if plan.tail is not None else [])]
        keep = frozenset(nodes)
        return all(n.page >= 0 or self._restore_page(n, keep) for n in nodes)

    def _restore_page(self, node: Node, keep: frozenset[Node]) -> bool:
        if not self.allocator.lease(node, len(node.key)):
            self.evict(1, keep)
            if not self.allocator.lease(node, len(node.key)):
                return False
        node.page = self.allocator.table(node)[0]
        self.host.load_page(node.host, node.page)
        self.host.release_page(node.host)
        node.host = -1
        self._host_leaves.discard(node)
        self._leaves.discard(node.parent)  # the parent is on the device: restored first
        if not self._device_children(node):
            self._leaves.add(node)
        self.pages += 1
        self.host_restored += 1
        return True

    def _adopt(self, node: Node, page: int) -> None:
        """A host node takes a request's page of the same tokens back onto the device."""
        self.allocator.share(node, [page])
        self.host.release_page(node.host)
        node.page, node.host = page, -1
        self._host_leaves.discard(node)
        self._leaves.discard(node.parent)
        if not self._device_children(node):
            self._leaves.add(node)
        self.pages += 1

    def _snapshot_to_host(self, node: Node) -> bool:
        """Move `node`'s device snapshot to a host slot (the host's LRU one gives way)."""
        if self.host_states is None:
            return False
        if not self.host_states.free:
            victim = min(self._host_snapshots, key=lambda n: n.restored)
            self.host_states.release(victim.host_snapshot)
            victim.host_snapshot = None
            self._host_snapshots.discard(victim)
            if len(victim.key) < self.page_tokens:
                self._remove(victim)  # a tail without its snapshot restores nothing
        node.host_snapshot = self.host_states.acquire()
        copy_state(node.snapshot, node.host_snapshot)
        self._host_snapshots.add(node)
        self.slots.release(node.snapshot)
        node.snapshot = None
        self._snapshots.discard(node)
        return True

    def _demote(self, node: Node, keep: tuple[Node, ...] | frozenset[Node]) -> bool:
        """Move a device leaf's page to the host tier (its LRU leaves, but `keep`, give way);
        False when the tier cannot take it."""
        host = self.host.save_page(node.page)
        while host is None:
            spare = [n for n in self._host_leaves if n not in keep and n is not node]
            if not spare:
                return False
            self._remove(min(spare, key=lambda n: n.used))
            host = self.host.save_page(node.page)
        self.allocator.release(node)
        node.page, node.host = -1, host
        self._leaves.discard(node)
        self.pages -= 1
        if not node.children:
            self._host_leaves.add(node)
        self._new_leaf(node.parent)
        return True
