"""`--media-cache-mib`: least recently used rows go first, within the byte capacity, on the host."""
import torch

from ninfer_engine.vision.cache import MediaCache


def test_least_recently_used_goes_first_within_capacity():
    rows = {k: torch.full((4, 8), float(i)) for i, k in enumerate("abc")}  # 128 bytes each
    cache = MediaCache(capacity_bytes=256)
    cache.put("a", rows["a"])
    cache.put("b", rows["b"])
    assert torch.equal(cache.get("a"), rows["a"])  # a is now the most recent
    cache.put("c", rows["c"])  # evicts b
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.bytes == 256 and (cache.hits, cache.misses) == (3, 1)
    cache.put("huge", torch.zeros(100, 100))  # over the capacity: not kept, nothing evicted
    assert cache.get("huge") is None and cache.bytes == 256


def test_zero_capacity_keeps_nothing():
    cache = MediaCache(0)
    cache.put("a", torch.ones(2))
    assert cache.get("a") is None and cache.bytes == 0
