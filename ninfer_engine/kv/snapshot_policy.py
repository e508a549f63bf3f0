"""Which recurrent-state snapshot of the prefix tree (`kv.radix`) gives way, and how many of each
kind it keeps (`--max-private-continuations`, `--max-shared-prefixes`,
`--max-long-anchors-per-continuation`).

Plain LRU let a long prompt's chunk snapshots (one every prefill chunk) push out every other
conversation's end and anchor snapshots. Two rules replace it:
- a continuation (the root path of a new snapshot) keeps at most a set number of long anchors
  (chunk boundaries inside a prompt), in either tier: however long a prompt, it takes that
  many slots, plus its end;
- a snapshot's standing is its last save or restore on the tree's clock (one tick per match or
  insert) plus `HIT_BONUS` ticks for each restore, up to `MAX_BONUS_HITS`: a snapshot that hits
  outlives that many newer saves. The lowest goes first.
On the 1,000-request random mix of tests/kv/test_prefix_fuzz.py (4 seeds), hits went from 723
(plain LRU) to 2,074 (device only) and 1,275 to 2,760 (with a host tier). Weighting by depth
(tokens saved) or a bonus for ends and anchors each lowered them there, so neither is used.

The private and shared limits are device budgets: past one, the lowest of that kind moves to
the host tier (or is dropped without one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .radix_nodes import Node

# the reuse paths of http-contract §4, named by what saved the checkpoint a hit ends at
REPLAY = "private_response_replay"  # a prompt's last token but one: the same prompt again
LONG_ANCHOR = "private_long_anchor"  # every `snapshot_tokens` of a long prompt
ENDPOINT = "private_endpoint"  # a finished answer: the conversation's next turn
TURN = "private_turn_closure"  # a message boundary (`--turn-anchors`)
STABLE = "shared_stable_prefix"  # a client's breakpoint; llama family: any earlier prompt's page
HIT_BONUS, MAX_BONUS_HITS = 32, 4


@dataclass(frozen=True)
class SnapshotLimits:
    """None: no limit of that kind (the slot pools alone bound it)."""

    private: int | None = None  # device snapshots of private continuations
    shared: int | None = None  # device snapshots of shared prefixes
    long_anchors: int | None = None  # long anchors on one root path, device and host


def kind_class(kind: str) -> str:
    return "long" if kind == LONG_ANCHOR else "shared" if kind == STABLE else "private"


def value(node: Node) -> tuple[int, int]:
    """Sort key: the lowest goes first."""
    return node.restored + HIT_BONUS * min(node.hits, MAX_BONUS_HITS), node.restored


def least_valuable(nodes: Iterable[Node]) -> Node:
    return min(nodes, key=value)


def long_anchors_on_path(node: Node) -> list[Node]:
    """The long-anchor snapshots (either tier) from `node` up to the root."""
    found = []
    while node is not None:
        if node.kind == LONG_ANCHOR and (node.snapshot or node.host_snapshot) is not None:
            found.append(node)
        node = node.parent
    return found
