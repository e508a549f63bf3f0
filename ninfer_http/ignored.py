"""Fields and tools a request may carry that this server accepts without acting on them.

Real clients send keys and hosted tools a local server cannot honour (Codex: `client_metadata`,
`web_search`, ...). They are accepted, and each name is logged once per process at debug level,
so an operator can see what was ignored without a line per request.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable

log = logging.getLogger("ninfer.http")

_SEEN: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def log_ignored(what: str, names: Iterable[str]) -> None:
    """Log `what: name` once per process for each name not logged before."""
    with _LOCK:
        fresh = [n for n in names if (what, n) not in _SEEN]
        _SEEN.update((what, n) for n in fresh)
    for name in fresh:
        log.debug("ignored %s: %s (accepted, has no effect on this server)", what, name)
