"""What a request holds while it runs: a KV lease, a recurrent-state slot, a reused prefix.

`SequenceMemory` applies the lease rules of DESIGN §5 and http-contract §4:
- admission reserves the prompt plus `min(kv_lease_window, max_tokens)` output tokens
  (window 0 = all of `max_tokens`), capped at the pool; checkpoints are evicted (LRU) before
  a request is made to wait, and requests are admitted in FIFO order;
- a running request grows page by page; when the pool cannot grow (after evicting
  checkpoints) the request finishes with `length`, never taking another request's pages;
- `budget_pages` (`--kv-budget-gib`) caps one request's page table: past it the request
  finishes with `length` even when the pool has pages to spare;
- a prompt that starts with a checkpoint's tokens restores it and computes only the rest.
"""
from __future__ import annotations

from typing import Any, Callable

from ..stats import KvStats, StateSlotStats
from .cache import KvStorage
from .slots import PrefixCache, StatePool, copy_state


class SequenceMemory:
    """KV pages, state slots and prefix checkpoints for the engine's sequences."""

    def __init__(self, storage: KvStorage, lease_window: int, max_running: int,
                 checkpoint_slots: int, prefix_reuse: bool, kv_dtype: str,
                 state_pool: Callable[[int], StatePool] | None = None,
                 budget_pages: int | None = None) -> None:
        self.storage = storage
        self.allocator = storage.allocator
        self.lease_window = lease_window
        self.budget_tokens = None if budget_pages is None else budget_pages * storage.page_tokens
        self.kv_dtype = kv_dtype
        recurrent = state_pool is not None
        # the running slots are the rows the decode step addresses; checkpoints have their own
        self.running_slots = state_pool(max_running) if recurrent else None
        checkpoint_state = (state_pool(checkpoint_slots if prefix_reuse else 0) if recurrent
                            else None)
        self.prefix = PrefixCache(storage, checkpoint_state,
                                  checkpoint_slots if prefix_reuse else 0)
        self.queries = 0  # admitted requests that looked for a checkpoint
        self.hits = 0  # ... and restored one

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
        """Lease pages (restoring the best prefix checkpoint); False: wait for pages or a slot."""
        if self.running_slots is not None and not self.running_slots.free:
            return False  # a cancelled request gives its slot back after this schedule
        tokens = self.lease_tokens(seq)
        while True:
            ckpt = self.prefix.match(seq.prompt) if self.prefix.capacity else None
            cache = self.storage.new_cache()
            if ckpt is not None:
                self.prefix.restore(ckpt, cache)
            if self.allocator.lease(cache, tokens):
                break
            cache.release()
            if not self.prefix.evict_lru():
                return False
        state = self.running_slots.acquire() if self.running_slots is not None else None
        reused = 0
        self.queries += bool(self.prefix.capacity)
        if ckpt is not None:
            self.hits += 1
            self.prefix.copy_partial(ckpt, cache)
            if state is not None:
                copy_state(ckpt.state, state)
            reused = len(ckpt.tokens)
        seq.cache, seq.state, seq.cached, seq.reused = cache, state, reused, reused
        return True

    def grow(self, seq: Any, tokens: int) -> bool:
        """Cover `tokens` positions; evicts checkpoints first. False: finish with `length`."""
        if tokens > self.request_tokens:
            return False  # over the request's budget: freeing pages would not help
        while not seq.cache.reserve(tokens):
            if not self.prefix.evict_lru():
                return False
        return True

    def checkpoint(self, seq: Any) -> None:
        """Save the sequence's computed frontier (its first `cached` tokens) for reuse."""
        if self.prefix.capacity and seq.cache is not None:
            tokens = (*seq.prompt, *seq.output)[: seq.cached]
            self.prefix.save(tuple(tokens), seq.cache, seq.state)

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
        checkpoints = self.prefix.slots.free if self.prefix.slots else 0
        return running + checkpoints

    def slot_stats(self) -> StateSlotStats:
        running, ckpt = self.running_slots, self.prefix.slots
        return StateSlotStats(
            running_total=running.total if running else 0,
            running_used=running.total - running.free if running else 0,
            checkpoint_total=ckpt.total if ckpt else 0,
            checkpoint_used=ckpt.total - ckpt.free if ckpt else 0,
            checkpoints=len(self.prefix))

    def stats(self, running: list[Any]) -> KvStats:
        a = self.allocator
        per_request = tuple((s.id, len(s.cache.pages)) for s in running if s.cache is not None)
        return KvStats(page_tokens=a.page_tokens, total=a.total, used=a.used, free=a.free,
                       lent=a.lent, dtype=self.kv_dtype, per_request=per_request)
