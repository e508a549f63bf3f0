"""The console's count of cached pages walks the whole prefix tree: while requests run it is
redone only when the tree changed or `IDLE_PAGES_REFRESH_S` passed; with none, every time."""
from __future__ import annotations

from types import SimpleNamespace

from ninfer_engine.kv import memory
from ninfer_engine.kv.memory import SequenceMemory


def test_the_idle_page_count_is_redone_when_it_can_have_changed(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: clock[0])
    walks = []
    tree = SimpleNamespace(pages=10, nodes=12)
    tree.idle_pages = lambda: walks.append(1) or tree.pages - 3
    mem = object.__new__(SequenceMemory)  # only the count's own state
    mem.prefix, mem._idle = tree, (0, None, 0.0)

    assert mem._idle_pages(busy=True) == 7 and len(walks) == 1  # the first count
    assert mem._idle_pages(busy=True) == 7 and len(walks) == 1  # unchanged, young: kept
    tree.pages += 2  # the tree changed: counted afresh
    assert mem._idle_pages(busy=True) == 9 and len(walks) == 2
    clock[0] += memory.IDLE_PAGES_REFRESH_S  # old enough: counted afresh
    assert mem._idle_pages(busy=True) == 9 and len(walks) == 3
    assert mem._idle_pages(busy=False) == 9 and len(walks) == 4  # nothing runs: every time
