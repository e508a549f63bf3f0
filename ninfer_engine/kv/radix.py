"""A radix tree over full KV pages shared by every request (SGLang's RadixAttention; for the
hybrid family its MambaRadixCache: recurrent-state snapshots kept at chosen nodes).

A node is one page of tokens under its parent's prefix. Full-page nodes own a reference to a
pool page that is full and never written again, so any number of requests share it in place
(the allocator's reference counts say who still reads it). A *tail* is a leaf of fewer than
`page_tokens` tokens: the partial last page of a finished answer (handed over, not copied) or
of a hybrid prompt snapshotted mid-page (copied); a hit on a tail copies its slots into the
request's own page, because the request goes on writing that page.

A hit for the llama family is the longest common prefix at token granularity (full pages
shared, then up to a page of slots copied). A hybrid hit needs the recurrent state at the
reuse point, so it restores the deepest node on the matched path that holds a snapshot. At
least the prompt's last token is always computed: its logits start the answer.

Eviction takes leaves no request references, least recently used first (hybrid: leaves
without a snapshot, which no hit can restore, before any with one). Snapshots live in their
own `StatePool`; when it is full the lowest-standing one gives way (`kv.snapshot_policy`:
recency plus a bonus per restore; a continuation keeps a bounded number of chunk snapshots).

With a host tier (`kv.host_tier`) an evicted page moves to host memory and its node stays in
the tree (`page` -1, `host` its host page): a node on the host has only host children, so the
device's eviction candidates are the device nodes without device children. A hit restores
the host pages on its path into device pages (evicting other idle leaves if it must; when
the pool has none to give, the hit stops at the last page on the device). Likewise a
snapshot that loses its device slot moves to a host slot, and a hit copies it from there.
The tier, when full, drops its own least recently used leaves and snapshots.
"""
from __future__ import annotations

import heapq
import itertools

from .cache import KvStorage
from .host_tier import HostTier
from .radix_host import HostMoves
from .radix_match import Matching
from .radix_nodes import Node
from .radix_snapshots import Snapshots
from .slots import StatePool, StateSlot
from .snapshot_policy import SnapshotLimits


class PrefixTree(Snapshots, HostMoves, Matching):
    """The tree over `storage`'s pages; `snapshots` None: the llama family (no state);
    `limits`: how many snapshots of each kind it keeps (`kv.snapshot_policy`)."""

    def __init__(self, storage: KvStorage, snapshots: StatePool | None = None,
                 host: HostTier | None = None, limits: SnapshotLimits = SnapshotLimits()
                 ) -> None:
        self.storage = storage
        self.allocator = storage.allocator
        self.page_tokens = storage.page_tokens
        self.slots = snapshots
        self.limits = limits
        self.now = 0  # the clock's last tick (snapshot values decay with it)
        self.host = host if host is not None and host.pages else None
        self.host_states = host.states if host is not None and host.states else None
        self.root = Node((), None, 0)
        self.pages = 0  # device pages the tree references
        self.nodes = 0
        self.evicted = 0  # pages given back to the pool by eviction, since start
        self.host_restored = 0  # host pages copied back for a hit, since start
        self._snapshots: set[Node] = set()
        self._host_snapshots: set[Node] = set()
        # eviction's candidates, kept as nodes come and go: device nodes without device
        # children; the host tier's own: host nodes without children
        self._leaves: set[Node] = set()
        self._host_leaves: set[Node] = set()
        self._demoted: dict[int, int] = {}  # host page -> device page, until `evict` copies
        self._clock = itertools.count(1)
        # the allocator's version when an eviction last came up short: until a page changes
        # hands, a request waiting at the queue's head does not walk the whole tree every step
        self._spent_at = -1

    @property
    def recurrent(self) -> bool:
        return self.slots is not None

    @property
    def snapshots(self) -> int:
        return len(self._snapshots)

    @property
    def host_snapshots(self) -> int:
        return len(self._host_snapshots)

    def insert(self, tokens: tuple[int, ...], pages: list[int], state: StateSlot | None = None,
               hand_over: bool = False, kind: str = "") -> None:
        """Add the computed prefix `tokens` whose K/V is in `pages` (a request's page table):
        its full pages shared; with `state` (the recurrent state after `tokens`) a snapshot at
        its end; its partial last page as a tail, handed over (`hand_over`: its writer is
        done with it) or copied (only with a snapshot: a hybrid prompt's). `kind`: the reuse
        path of the nodes it adds and of its snapshot."""
        P, now = self.page_tokens, self._tick()
        node = self.root
        for i in range(len(tokens) // P):
            key = tokens[i * P: (i + 1) * P]
            child = node.children.get(key)
            if child is None:
                child = self._add(node, key, pages[i], kind)
            elif child.page < 0:  # on the host: the request's own page holds the same K/V
                self._adopt(child, pages[i])
            child.used = now
            node = child
        k = len(tokens) % P
        if k == 0:
            if state is not None and node is not self.root:
                self._keep_snapshot(node, state, now, kind)
            return
        key = tokens[-k:]
        tail = node.children.get(key)
        if tail is not None:
            tail.used = now
            if state is not None:
                self._keep_snapshot(tail, state, now, kind)
            return
        if state is not None and self._refused(kind):
            return  # its kind keeps no snapshot: the tail would restore nothing
        if state is None and (self.recurrent or not hand_over):
            return  # a hybrid tail without a snapshot restores nothing
        if hand_over:
            tail = self._add(node, key, pages[len(tokens) // P], kind)
        else:
            tail = Node(key, node, node.depth + k, kind=kind)
            if not self._lease(tail, k, keep=(node,)):
                return
            self.storage.copy_slots(pages[len(tokens) // P], self.allocator.table(tail)[0], k)
            tail.page = self.allocator.table(tail)[0]
            self._attach(node, tail)
        tail.used = now
        if state is not None and not self._snapshot(tail, state):
            self._remove(tail)

    def _tick(self) -> int:
        self.now = next(self._clock)
        return self.now

    def _add(self, parent: Node, key: tuple[int, ...], page: int, kind: str) -> Node:
        child = Node(key, parent, parent.depth + len(key), page, kind=kind)
        self.allocator.share(child, [page])
        self._attach(parent, child)
        return child

    def _device_children(self, node: Node) -> bool:
        return any(child.page >= 0 for child in node.children.values())

    def _attach(self, parent: Node, child: Node) -> None:
        parent.children[child.key] = child
        self._leaves.discard(parent)
        self._leaves.add(child)
        self.pages, self.nodes = self.pages + 1, self.nodes + 1

    def _lease(self, tail: Node, k: int, keep: tuple[Node, ...]) -> bool:
        """One page for a copied tail, evicting a leaf if the pool has none."""
        if self.allocator.lease(tail, k):
            return True
        self.evict(1, keep)
        return self.allocator.lease(tail, k)

    def _remove(self, node: Node) -> None:
        """Take a leaf out of the tree and drop its page (device or host) and snapshots."""
        del node.parent.children[node.key]
        self._leaves.discard(node)
        self._host_leaves.discard(node)
        self._new_leaf(node.parent)
        self._drop_snapshot(node)
        if node.page >= 0:
            self.allocator.release(node)
            self.pages -= 1
        else:
            self.host.release_page(node.host)
        self.nodes -= 1

    def _new_leaf(self, node: Node) -> None:
        """`node` lost a device child: it may have become a candidate of its tier."""
        if node is self.root:
            return
        if node.page >= 0 and not self._device_children(node):
            self._leaves.add(node)
        elif node.page < 0 and not node.children:
            self._host_leaves.add(node)

    def _evictable(self, node: Node, keep: tuple[Node, ...] | frozenset[Node]) -> bool:
        return (node is not self.root and node not in keep and node.page >= 0
                and not self._device_children(node) and self.allocator.refs(node.page) == 1)

    def evict(self, pages: int, keep: tuple[Node, ...] | frozenset[Node] = ()) -> int:
        """Free up to `pages` device pages from unreferenced leaves, least recently used first
        (a parent left without device children joins the candidates), moving them to the host
        tier where there is one; `keep` is spared. Returns pages freed."""
        if self._spent_at == self.allocator.version:
            return 0

        def rank(node: Node) -> tuple:
            return (self.recurrent and (node.snapshot or node.host_snapshot) is not None,
                    node.used, id(node), node)

        heap = [rank(node) for node in self._leaves if self._evictable(node, keep)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < pages:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            if self.host is None or not self._demote(node, keep):
                if node.children:
                    continue  # its host children hold it: the full tier keeps them
                self._remove(node)
            freed += 1
            if self._evictable(parent, keep):
                heapq.heappush(heap, rank(parent))
        if self.host is not None:
            self._copy_demoted()
        self.evicted += freed
        if freed < pages and not keep:
            self._spent_at = self.allocator.version
        return freed

    def _walk(self):
        """Every node but the root."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def held_pages(self) -> set[int]:
        """Every device page the tree references."""
        return {node.page for node in self._walk() if node.page >= 0}

    def idle_pages(self) -> int:
        """Device pages only the tree references (no running request shares them)."""
        return sum(1 for node in self._walk()
                   if node.page >= 0 and self.allocator.refs(node.page) == 1)

    def clear(self) -> None:
        """Drop every node (pages a request still shares stay with that request)."""
        for node in list(self._walk()):
            self._drop_snapshot(node)
            if node.page >= 0:
                self.allocator.release(node)
            else:
                self.host.release_page(node.host)
        self.root.children.clear()
        self._leaves.clear()
        self._host_leaves.clear()
        self.pages = self.nodes = 0
