"""How the prefix tree (`kv.radix`) finds a prompt's hit: the prompt's full pages down the tree,
then, for the llama family, the child sharing the most leading tokens with the rest (its first
slots copied), or, for the hybrid family, the deepest node on the path that holds a snapshot or
a snapshot-holding tail. The hit's host pages are copied back first (`kv.radix_host`); where the
pool is short the hit stops at the last page on the device. `Matching` is a part of
`PrefixTree`, apart only to keep each file to one concern: it reads the tree's own fields."""
from __future__ import annotations

import itertools

from .radix_nodes import Match, Node, Plan, common_prefix


class Matching:
    def match(self, prompt: tuple[int, ...]) -> Match:
        """The deepest restorable prefix of `prompt`, shorter than `prompt`; its pages in the
        host tier are copied back first."""
        P, limit, now = self.page_tokens, len(prompt) - 1, self._tick()
        node, path = self.root, []
        while node.depth + P <= limit:
            child = node.children.get(prompt[node.depth: node.depth + P])
            if child is None:
                break
            node = child
            path.append(child)
        plan = self._plan(path, prompt, limit, host_tails=True)
        if not self._restore(plan):  # the pool is short: reuse what is on the device
            on_device = list(itertools.takewhile(lambda n: n.page >= 0, path))
            plan = self._plan(on_device, prompt, limit, host_tails=False)
        for n in plan.path:
            n.used = now
        if plan.tail is not None:
            plan.tail.used = now
        if plan.snap is not None:
            plan.snap.restored = now
            plan.snap.hits += 1
        snapshot = None if plan.snap is None else plan.snap.snapshot or plan.snap.host_snapshot
        end = plan.snap or plan.tail or (plan.path[-1] if plan.path else None)
        return Match(plan.tokens, tuple(n.page for n in plan.path),
                     None if plan.tail is None else (plan.tail.page, plan.k), snapshot,
                     plan.tail, end.kind if plan.tokens and end is not None else "root")

    def _plan(self, path: list[Node], prompt: tuple[int, ...], limit: int,
              host_tails: bool) -> Plan:
        """The hit along `path` (the prompt's full pages found in the tree)."""
        if not self.recurrent:
            node = path[-1] if path else self.root
            best = self._token_match(node, prompt[node.depth: limit], host_tails)
            if best is None:
                return Plan(path, tokens=node.depth)
            tail, k = best
            return Plan(path, tail, k, tokens=node.depth + k)
        plan, P = Plan([]), self.page_tokens
        for depth, at in enumerate([self.root, *path]):
            if at.snapshot is not None or at.host_snapshot is not None:
                plan = Plan(path[:depth], snap=at, tokens=at.depth)
            # a tail is shorter than a page: slicing the whole rest made a hit O(context²)
            tail = self._tail_match(at, prompt[at.depth: min(limit, at.depth + P)], host_tails)
            if tail is not None and tail.depth > plan.tokens:
                plan = Plan(path[:depth], tail, len(tail.key), tail, tail.depth)
        return plan

    def _token_match(self, node: Node, rest: tuple[int, ...],
                     host_tails: bool) -> tuple[Node, int] | None:
        """The child of `node` sharing the most leading tokens with `rest`, and how many."""
        best, most = None, 0
        for child in node.children.values():
            if (child.key[0] == (rest[0] if rest else None)
                    and (host_tails or child.page >= 0)):
                k = common_prefix(child.key, rest)
                if k > most:
                    best, most = child, k
        return (best, most) if best is not None else None

    def _tail_match(self, node: Node, rest: tuple[int, ...], host_tails: bool) -> Node | None:
        """The longest snapshot-holding tail of `node` whose tokens start `rest`."""
        best = None
        for child in node.children.values():
            k = len(child.key)
            if ((child.snapshot is not None or child.host_snapshot is not None)
                    and (host_tails or child.page >= 0) and k < self.page_tokens
                    and k <= len(rest) and child.key == rest[:k]
                    and (best is None or k > len(best.key))):
                best = child
        return best
