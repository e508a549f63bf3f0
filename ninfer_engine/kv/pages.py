"""The shared KV page pool: page accounting, per-owner page tables, leases (DESIGN §5).

`PageAllocator` is the interface the engine programs against; `PagePool` is the host-side
implementation (a free list plus reference counts, so prefix checkpoints can share the full
pages of a conversation with the requests that continue it). Owners are opaque hashable keys:
a request's cache or a checkpoint.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable

from ..config import PAGE_TOKENS


def pages_for(tokens: int, page_tokens: int = PAGE_TOKENS) -> int:
    return -(-tokens // page_tokens)


class PageAllocator(ABC):
    """Fixed-size pages of `page_tokens` token slots each, handed to owners.

    Every method is all-or-nothing: a call that cannot be satisfied changes nothing.
    """

    page_tokens: int
    total: int

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

    @property
    @abstractmethod
    def free(self) -> int:
        """Pages no owner references."""

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def lent(self) -> int:
        """Pages lent to the expert-slot cache (elastic mode only; never here)."""
        return 0


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

    def lease(self, owner: Hashable, tokens: int) -> bool:
        table = self._tables.setdefault(owner, [])
        need = pages_for(tokens, self.page_tokens) - len(table)
        if need > len(self._free):
            if not table:
                del self._tables[owner]
            return False
        for _ in range(max(need, 0)):
            page = self._free.pop()
            self._refs[page] = 1
            table.append(page)
        return True

    def share(self, owner: Hashable, pages: list[int]) -> None:
        for page in pages:
            if self._refs[page] <= 0:
                raise ValueError(f"page {page} is not in use and cannot be shared")
            self._refs[page] += 1
        self._tables.setdefault(owner, []).extend(pages)

    def release(self, owner: Hashable) -> None:
        for page in self._tables.pop(owner, []):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)

    def table(self, owner: Hashable) -> list[int]:
        return self._tables.get(owner, [])

    @property
    def free(self) -> int:
        return len(self._free)

    def owners(self) -> int:
        """How many owners hold a table (0 once everything was released)."""
        return len(self._tables)
