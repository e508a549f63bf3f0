"""How the prefix tree (`kv.radix`) moves pages and snapshots between the device and its host
tier (`kv.host_tier`): a device leaf's page demoted to a host page when the pool needs it, host
pages restored for a hit (or adopted from a request that computed the same tokens); snapshots
move in `kv.radix_snapshots`. `HostMoves` is a part of
`PrefixTree`, apart only to keep each file to one concern: it reads the tree's own fields."""
from __future__ import annotations

from .radix_nodes import Node, Plan


class HostMoves:
    def _restore(self, plan: Plan) -> bool:
        """Copy the plan's host pages back into device pages, in one batched copy; False if
        the pool ran short (the pages leased until then are restored)."""
        nodes = [*plan.path, *([plan.tail] if plan.tail is not None else [])]
        keep, moved = frozenset(nodes), []
        missing = [n for n in nodes if n.page < 0]
        if not missing:
            return True
        short = len(missing) - self.allocator.free
        if short > 0 and self.allocator.capacity == self.allocator.total:  # (not a growing pool)
            self.evict(short, keep)  # at once: their demotions are one batched copy
        for node in missing:
            if not self.allocator.lease(node, len(node.key)):
                self.evict(1, keep)
                if not self.allocator.lease(node, len(node.key)):
                    break
            node.page = self.allocator.table(node)[0]
            moved.append(node)
        if moved:
            self.host.load_pages([n.host for n in moved], [n.page for n in moved])
        for node in moved:  # path order: each parent is on the device before its child
            self.host.release_page(node.host)
            node.host = -1
            self._host_leaves.discard(node)
            self._leaves.discard(node.parent)
            if not self._device_children(node):
                self._leaves.add(node)
        self.pages += len(moved)
        self.host_restored += len(moved)
        return len(moved) == len(missing)

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

    def _demote(self, node: Node, keep: tuple[Node, ...] | frozenset[Node]) -> bool:
        """Move a device leaf's page to the host tier (its LRU leaves, but `keep`, give way);
        False when the tier cannot take it. The copy waits in `_demoted` for
        `_copy_demoted`, which `evict` calls before it returns."""
        host = self.host.take_page()
        while host is None:
            spare = [n for n in self._host_leaves if n not in keep and n is not node]
            if not spare:
                return False
            self._remove(min(spare, key=lambda n: n.used))
            host = self.host.take_page()
        self._demoted[host] = node.page  # a host page taken again: its last page wins
        self.allocator.release(node)
        node.page, node.host = -1, host
        self._leaves.discard(node)
        self.pages -= 1
        if not node.children:
            self._host_leaves.add(node)
        self._new_leaf(node.parent)
        return True

    def _copy_demoted(self) -> None:
        """The pages `_demote` moved, copied to the host in one batch (queued on the stream
        before anything can write the device pages they leave)."""
        if self._demoted:
            hosts = list(self._demoted)
            self.host.copy_out([self._demoted[h] for h in hosts], hosts)
            self._demoted.clear()
