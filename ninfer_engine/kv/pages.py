"""The shared KV page pool: page accounting, per-owner page tables, leases (DESIGN §5).

`PageAllocator` is the interface the engine programs against; `PagePool` is the host-side
implementation (a free list plus reference counts, so the prefix tree can share the full
pages every request with the same prefix reads). `ElasticPagePool` (`--elastic`)
starts at one grow step and adds steps when a lease needs them, up to its capacity; listeners
(the K/V storage) extend their tensors before the new pages are handed out. Owners are opaque
hashable keys: a request's cache or a prefix-tree node.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable

from ..config import PAGE_TOKENS


def pages_for(tokens: int, page_tokens: int = PAGE_TOKENS) -> int:
    return -(-tokens // page_tokens)


class PageAllocator(ABC):
    """Fixed-size pages of `page_tokens` token slots each, handed to owners.

    Every method is all-or-nothing: a call that cannot be satisfied changes nothing.
    """

    page_tokens: int
    total: int
    version: int  # changes whenever a page changes hands (lease, share, release)

    @abstractmethod
    def lease(self, owner: Hashable, tokens: int) -> bool:
        """Make `owner`'s page table cover `tokens` token positions (a new owner starts empty).

        False, with nothing allocated, when the free pages do not suffice.
        """

    def grow(self, owner: Hashable, tokens: int) -> bool:
        """Extend an existing lease to `tokens` positions (same rule as `lease`)."""
        return self.lease(owner, tokens)

    @abstractmethod
    def share(self, owner: Hashable, pages: list[int]) -> None:
        """Append `pages` (full, never written again) to `owner`'s table, taking a reference."""

    @abstractmethod
    def release(self, owner: Hashable) -> None:
        """Drop `owner`'s table; pages no other owner references become free."""

    @abstractmethod
    def table(self, owner: Hashable) -> list[int]:
        """`owner`'s page ids in position order (empty for an unknown owner)."""

    @abstractmethod
    def refs(self, page: int) -> int:
        """How many owners reference `page` (the prefix tree evicts pages only it holds)."""

    @property
    @abstractmethod
    def free(self) -> int:
        """Pages no owner references."""

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def capacity(self) -> int:
        """The most pages the pool can ever hold (`total` for a fixed pool)."""
        return self.total

    @property
    def lent(self) -> int:
        """Pages lent to the expert-slot cache (only an elastic pool lends)."""
        return 0

    def on_grow(self, listener: Callable[[int], None]) -> None:
        """Call `listener(new_total)` before the pool grows (a fixed pool never does); the
        listener raises `MemoryError` to refuse the growth."""


class PagePool(PageAllocator):
    """Free list + reference counts over `total` pages."""

    def __init__(self, total: int, page_tokens: int = PAGE_TOKENS) -> None:
        if total <= 0:
            raise ValueError("the KV pool needs at least one page")
        self.total = total
        self.page_tokens = page_tokens
        self._free = list(range(total - 1, -1, -1))  # pop() hands out low ids first
        self._refs = [0] * total
        self._tables: dict[Hashable, list[int]] = {}
        self.version = 0

    def lease(self, owner: Hashable, tokens: int) -> bool:
        table = self._tables.setdefault(owner, [])
        need = pages_for(tokens, self.page_tokens) - len(table)
        if need > len(self._free):
            if not table:
                del self._tables[owner]
            return False
        self.version += 1
        for _ in range(max(need, 0)):
            page = self._free.pop()
            self._refs[page] = 1
            table.append(page)
        return True

    def share(self, owner: Hashable, pages: list[int]) -> None:
        self.version += 1
        for page in pages:
            if self._refs[page] <= 0:
                raise ValueError(f"page {page} is not in use and cannot be shared")
            self._refs[page] += 1
        self._tables.setdefault(owner, []).extend(pages)

    def release(self, owner: Hashable) -> None:
        self.version += 1
        for page in self._tables.pop(owner, []):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)

    def table(self, owner: Hashable) -> list[int]:
        return self._tables.get(owner, [])

    def refs(self, page: int) -> int:
        return self._refs[page]

    @property
    def free(self) -> int:
        return len(self._free)

    def owners(self) -> int:
        """How many owners hold a table (0 once everything was released)."""
        return len(self._tables)

    def _extend(self, pages: int) -> None:
        """Add `pages` free pages with the next ids."""
        start = self.total
        self.total += pages
        self._refs.extend([0] * pages)
        # below the existing free pages, so the pool keeps handing out its lowest ids first
        self._free[:0] = range(self.total - 1, start - 1, -1)


class ElasticPagePool(PagePool):
    """A `PagePool` that starts at `step` pages and grows by whole steps, up to `capacity`.

    A lease the free pages cannot cover grows the pool by the fewest steps that cover it; a
    lease that would not fit even at `capacity`, or whose growth a listener refuses with
    `MemoryError`, fails without growing anything.

    Capacity not grown into can be lent (`lend`, the expert-slot cache: `experts.tiers`); a
    growth that needs it takes it back first through the borrower's `give_back(pages)`, which
    returns the pages it freed.
    """

    def __init__(self, capacity: int, step: int, page_tokens: int = PAGE_TOKENS) -> None:
        if step <= 0 or capacity <= 0:
            raise ValueError("an elastic KV pool needs a positive grow step and capacity")
        super().__init__(min(step, capacity), page_tokens)
        self.step = step
        self._capacity = capacity
        self._listeners: list[Callable[[int], None]] = []
        self._lent = 0
        self._give_back: Callable[[int], int] | None = None

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def lent(self) -> int:
        return self._lent

    def lend_room(self) -> int:
        """Pages of the capacity neither grown into nor lent."""
        return self._capacity - self.total - self._lent

    def lend(self, pages: int, give_back: Callable[[int], int]) -> None:
        """Lend `pages` (at most `lend_room()`) to a borrower that returns them on demand."""
        if not 0 <= pages <= self.lend_room():
            raise ValueError(f"cannot lend {pages} pages: {self.lend_room()} are unused")
        self._lent += pages
        self._give_back = give_back

    def on_grow(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def lease(self, owner: Hashable, tokens: int) -> bool:
        short = pages_for(tokens, self.page_tokens) - len(self.table(owner)) - self.free
        if short > self.lend_room() and self._lent:  # lent pages come back before any fails
            self._lent -= self._give_back(min(short - self.lend_room(), self._lent))
        if 0 < short <= self.lend_room():
            steps = -(-short // self.step)
            added = min(steps * self.step, self.lend_room())  # never into lent pages
            try:
                for listener in self._listeners:  # storage first: the new pages must exist
                    listener(self.total + added)
            except MemoryError:
                return False  # the device has no room to grow: like an exhausted pool
            self._extend(added)
        return super().lease(owner, tokens)
