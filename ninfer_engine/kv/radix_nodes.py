"""The prefix tree's nodes (`kv.radix`), a hit's plan and what a hit restores."""
from __future__ import annotations

from dataclasses import dataclass, field

from .slots import StateSlot


@dataclass(eq=False)
class Node:
    """`key`: this node's tokens (a full page, or fewer for a tail); `depth`: tokens from the
    root through this node. The node is its page's owner in the allocator."""

    key: tuple[int, ...]
    parent: Node | None
    depth: int
    page: int = -1
    host: int = -1  # its page in the host tier while `page` is -1
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    snapshot: StateSlot | None = None
    host_snapshot: StateSlot | None = None  # the snapshot, moved to a host slot
    used: int = 0  # LRU clock of the last hit or insert through this node
    kind: str = ""  # the reuse path a hit ending here reports: who saved it (`insert`)
    restored: int = 0  # LRU clock of the snapshot's last save or restore
    hits: int = 0  # restores of its snapshot (`kv.snapshot_policy` values it by them)


@dataclass(frozen=True)
class Plan:
    """A hit before its host pages are restored: the full pages shared (`path`), a tail
    whose first `k` slots are copied, the node whose snapshot is restored, tokens reused."""

    path: list[Node]
    tail: Node | None = None
    k: int = 0
    snap: Node | None = None
    tokens: int = 0


@dataclass(frozen=True)
class Match:
    """What a prompt restores: `pages` to share, then `copy` = (page, slots) to copy into the
    request's next page, and the recurrent `snapshot` at `tokens` (hybrid family)."""

    tokens: int = 0
    pages: tuple[int, ...] = ()
    copy: tuple[int, int] | None = None
    snapshot: StateSlot | None = None
    source: Node | None = None  # the copied node: kept while the request's pages are leased
    kind: str = "root"  # the reuse path (http-contract §4): the kind of the node it ends at


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])
