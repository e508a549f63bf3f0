"""What a request holds while it runs: a KV lease, a recurrent-state slot, a reused prefix.

`SequenceMemory` applies the lease rules of DESIGN §5 and http-contract §4:
- admission reserves the prompt plus `min(kv_lease_window, max_tokens)` output tokens
  (window 0 = all of `max_tokens`), capped at the pool; idle prefix-tree pages are evicted
  (LRU leaves) before a request is made to wait, and requests are admitted in FIFO order;
- a running request grows page by page; when the pool cannot grow (after evicting idle tree
  pages) the request finishes with `length`, never taking another request's pages;
- `budget_pages` (`--kv-budget-gib`) caps one request's page table: past it the request
  finishes with `length` even when the pool has pages to spare;
- a prompt restores the deepest prefix the tree holds (`kv.radix`) and computes only the rest.
  The tree gets every prompt's full pages as they are computed and every finished answer; for
  the hybrid family a recurrent-state snapshot at every prompt's last token but one (the same
  prompt again restores all but the token whose logits it needs), every finished answer and
  every `snapshot_tokens` of a prompt (prefill chunks are cut there: `chunk_tokens`).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..stats import KvStats, PrefixStats, StateSlotStats
from .cache import KvStorage
from .host_tier import HostTier
from .pages import pages_for
from .radix import PrefixTree
from .radix_nodes import Match
from .slots import StatePool, copy_state
from .snapshot_policy import ENDPOINT, LONG_ANCHOR, REPLAY, STABLE, SnapshotLimits

# while requests run, the console's count of cached pages (a walk of the whole prefix tree:
# ~6.6 ms at 9,216 pages on a 2-core VM, against a snapshot every 50 ms) is redone when the
# tree changed or this long passed; with nothing running, every time
IDLE_PAGES_REFRESH_S = 1.0
SNAPSHOT_TOKENS = 1024  # the CPU's prefill chunk: where a long hybrid prompt is snapshotted


class SequenceMemory:
    """KV pages, state slots and the prefix tree for the engine's sequences."""

    def __init__(self, storage: KvStorage, lease_window: int, max_running: int,
                 checkpoint_slots: int, prefix_reuse: bool, kv_dtype: str,
                 state_pool: Callable[[int], StatePool] | None = None,
                 budget_pages: int | None = None,
                 snapshot_tokens: int = SNAPSHOT_TOKENS,
                 host_tier: Callable[[StatePool | None], HostTier] | None = None,
                 limits: SnapshotLimits = SnapshotLimits()) -> None:
        """`host_tier(snapshots)`: builds the prefix tree's host tier (`kv.host_tier`) beside
        the device snapshot pool (None for the llama family); `limits`: snapshots kept of
        each kind (`kv.snapshot_policy`)."""
        self.storage = storage
        self.allocator = storage.allocator
        self.lease_window = lease_window
        self.budget_tokens = None if budget_pages is None else budget_pages * storage.page_tokens
        self.kv_dtype = kv_dtype
        recurrent = state_pool is not None
        # the running slots are the rows the decode step addresses; snapshots have their own
        self.running_slots = state_pool(max_running) if recurrent else None
        snapshots = state_pool(checkpoint_slots if prefix_reuse else 0) if recurrent else None
        # a hybrid tree without snapshot slots could restore nothing
        reuse = prefix_reuse and (not recurrent or checkpoint_slots > 0)
        host = host_tier(snapshots) if reuse and host_tier is not None else None
        self.prefix = PrefixTree(storage, snapshots, host, limits) if reuse else None
        self._idle = (0, None, 0.0)  # (idle pages, the tree's (pages, nodes), when counted)
        self.snapshot_slots = snapshots
        page = storage.page_tokens
        self.snapshot_tokens = max(snapshot_tokens // page, 1) * page
        self.queries = 0  # admitted requests that looked the prompt up in the tree
        self.hits = 0  # ... and restored a prefix
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def request_tokens(self) -> int:
        """The most positions one request can lease: the pool's capacity, or the budget."""
        pool = self.allocator.capacity * self.allocator.page_tokens
        return pool if self.budget_tokens is None else min(pool, self.budget_tokens)

    def lease_tokens(self, seq: Any) -> int:
        """Prompt + the output window, capped at the pool's capacity and the request budget."""
        max_tokens = seq.request.max_tokens
        window = max_tokens if self.lease_window == 0 else min(self.lease_window, max_tokens)
        return min(len(seq.prompt) + max(window, 1), self.request_tokens)

    def admit(self, seq: Any) -> bool:
        """Lease pages (sharing the longest prefix in the tree); False: wait for pages or a
        slot."""
        if self.running_slots is not None and not self.running_slots.free:
            return False  # a cancelled request gives its slot back after this schedule
        tokens = self.lease_tokens(seq)
        # a scored prompt is computed in full: a reused position has no logits
        scored = seq.request.prompt_logprobs is not None
        hit = (self.prefix.match(seq.prefix_key) if self.prefix is not None and not scored
               else Match())
        cache = self.storage.new_cache()
        self.allocator.share(cache, list(hit.pages))
        if not self._lease(cache, tokens, hit):
            cache.release()
            if not hit.tokens:
                return False
            # the hit's own pages are all the pool could give back: take them, reuse nothing
            hit, cache = Match(), self.storage.new_cache()
            if not self._lease(cache, tokens):
                cache.release()
                return False
        state = None
        try:  # a copy that fails (out of memory, say) gives the lease back with the error
            state = self.running_slots.acquire() if self.running_slots is not None else None
            if hit.copy is not None:  # the request writes the rest of this page: its own copy
                page, slots = hit.copy
                self.storage.copy_slots(page, cache.pages[len(hit.pages)], slots)
            if hit.snapshot is not None:
                copy_state(hit.snapshot, state)
        except BaseException as exc:
            cache.release()
            if state is not None:
                self.running_slots.release(state)
            if isinstance(exc, torch.OutOfMemoryError):  # the scheduler's memory signal
                raise MemoryError(str(exc)) from exc
            raise
        if self.prefix is not None:
            self.queries += 1
            self.hits += hit.tokens > 0
            self.query_tokens += len(seq.prompt)
            self.hit_tokens += hit.tokens
        seq.cache, seq.state, seq.cached, seq.reused = cache, state, hit.tokens, hit.tokens
        seq.reuse_path = hit.kind
        return True

    def _lease(self, cache: Any, tokens: int, hit: Match = Match()) -> bool:
        """Cover `tokens` positions, evicting idle tree pages when the pool is short."""
        a = self.allocator
        while not a.lease(cache, tokens):
            if self.prefix is None:
                return False
            # an elastic pool may still grow by its headroom; a refused growth evicts one
            short = pages_for(tokens, a.page_tokens) - len(cache.pages) - a.free - (
                a.capacity - a.total)
            keep = () if hit.source is None else (hit.source,)
            if not self.prefix.evict(max(short, 1), keep):
                return False
        return True

    def grow(self, seq: Any, tokens: int) -> bool:
        """Cover `tokens` positions; evicts idle tree pages first. False: finish with
        `length`."""
        if tokens > self.request_tokens:
            return False  # over the request's budget: freeing pages would not help
        return tokens <= seq.cache.capacity or self._lease(seq.cache, tokens)

    def chunk_tokens(self, seq: Any, tokens: int) -> int:
        """A prefill chunk of up to `tokens`, cut so a hybrid prompt's chunks end on each
        snapshot boundary, each of its anchors and one token before its end (the recurrent
        state exists only where a chunk ends; the last token then runs alone, one step later,
        with the decode rows)."""
        if self.prefix is None or not self.prefix.recurrent:
            return tokens
        end, last = seq.cached + tokens, len(seq.prompt) - 1
        cuts = [p for p in (end - end % self.snapshot_tokens, last, *self._anchors(seq))
                if seq.cached < p < end]
        return min(cuts) - seq.cached if cuts else tokens

    def _anchors(self, seq: Any) -> dict[int, str]:
        """The request's anchors inside its prompt (not its last token: that one is sampled)."""
        return {p: kind for p, kind in seq.request.anchors if 0 < p < len(seq.prompt) - 1}

    def prefilled(self, seq: Any) -> None:
        """After a prefill chunk: its full pages join the tree (llama family: every chunk;
        hybrid: with a snapshot, at a snapshot boundary and one token before the prompt's
        end)."""
        if self.prefix is None or seq.cache is None:
            return
        n = min(seq.cached, len(seq.prompt))
        if not self.prefix.recurrent:
            self.prefix.insert(seq.prefix_key[:n], seq.cache.pages, kind=STABLE)
            return
        kind = self._anchors(seq).get(n) or (REPLAY if n == len(seq.prompt) - 1 else LONG_ANCHOR)
        if (n == len(seq.prompt) - 1 or kind != LONG_ANCHOR
                or (n % self.snapshot_tokens == 0 and n < len(seq.prompt))):
            self.prefix.insert(seq.prefix_key[:n], seq.cache.pages, seq.state, kind=kind)

    def checkpoint(self, seq: Any) -> None:
        """A finished answer: its computed frontier (the first `cached` tokens of prompt and
        output) joins the tree, its partial last page handed over (call before `release`)."""
        if self.prefix is not None and seq.cache is not None:
            tokens = (*seq.prefix_key, *seq.output)[: seq.cached]
            self.prefix.insert(tuple(tokens), seq.cache.pages, seq.state, hand_over=True,
                               kind=ENDPOINT)

    def forget_prefixes(self) -> None:
        """Drop the tree and its counters (after the startup warm-up's random prompts)."""
        if self.prefix is not None:
            self.prefix.clear()
            self.prefix.evicted = 0
        self.queries = self.hits = self.query_tokens = self.hit_tokens = 0

    def release(self, seq: Any) -> None:
        """Give back the sequence's pages and state slot (finish, cancel or error)."""
        if seq.cache is not None:
            seq.cache.release()
            seq.cache = None
        if seq.state is not None:
            self.running_slots.release(seq.state)
            seq.state = None

    @property
    def free_state_slots(self) -> int:
        running = self.running_slots.free if self.running_slots else 0
        snapshots = self.snapshot_slots.free if self.snapshot_slots else 0
        return running + snapshots

    def slot_stats(self) -> StateSlotStats:
        running, snap, tree = self.running_slots, self.snapshot_slots, self.prefix
        return StateSlotStats(
            running_total=running.total if running else 0,
            running_used=running.total - running.free if running else 0,
            checkpoint_total=snap.total if snap else 0,
            checkpoint_used=snap.total - snap.free if snap else 0,
            checkpoints=0 if tree is None else (
                tree.snapshots if tree.recurrent else tree.nodes))

    def prefix_stats(self) -> PrefixStats:
        tree = self.prefix
        if tree is None:
            return PrefixStats(lookups=self.queries)
        host, states = tree.host, tree.host_states
        return PrefixStats(
            lookups=self.queries, hits=self.hits, lookup_tokens=self.query_tokens,
            hit_tokens=self.hit_tokens, pages=tree.pages, nodes=tree.nodes,
            snapshots=tree.snapshots, evicted_pages=tree.evicted,
            host_pages=host.used_pages if host else 0, host_total=host.pages if host else 0,
            host_snapshots=tree.host_snapshots, host_snapshot_total=states.total if states else 0,
            host_restored_pages=tree.host_restored)

    def host_tier_bytes(self) -> tuple[int, int]:
        """The host tier's (KV, state) allocations in bytes."""
        host = self.prefix.host if self.prefix is not None else None
        return (host.kv_bytes, host.state_bytes) if host is not None else (0, 0)

    def _idle_pages(self, busy: bool) -> int:
        """The tree's pages no request shares: counted afresh unless requests run, the tree
        is unchanged and the count is younger than `IDLE_PAGES_REFRESH_S` (requests sharing
        or dropping its pages meanwhile show at the next count)."""
        tree, now = self.prefix, time.monotonic()
        idle, shape, at = self._idle
        if not busy or shape != (tree.pages, tree.nodes) or now - at >= IDLE_PAGES_REFRESH_S:
            idle = tree.idle_pages()
            self._idle = (idle, (tree.pages, tree.nodes), now)
        return idle

    def stats(self, running: list[Any]) -> KvStats:
        a = self.allocator
        per_request = tuple((s.id, len(s.cache.pages)) for s in running if s.cache is not None)
        cached = self._idle_pages(bool(running)) if self.prefix is not None else 0
        # an elastic pool's room not grown into nor lent is free: the four counts sum to capacity
        room = a.capacity - a.total - a.lent
        return KvStats(page_tokens=a.page_tokens, total=a.capacity, used=a.used - cached,
                       free=a.free + room, lent=a.lent, dtype=self.kv_dtype,
                       per_request=per_request, cached=cached)
