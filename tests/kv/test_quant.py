"""KV codecs: round-trip error per dtype, and writes/reads through scattered pool pages."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.kv import KV_DTYPES, KvStorage, PagePool, codecs_for

# max |x - decode(encode(x))| / max|x| per head vector, on Gaussian rows (measured, with margin)
ROUND_TRIP_BOUND = {"bf16": 0.0, "int8": 0.005, "fp8": 0.07, "nvfp4": 0.2, "k8v4": 0.08}


def _rows(n=256, heads=4, dim=64, seed=0):
    return torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_round_trip_error(kv_dtype):
    x = _rows()
    errors = []
    for codec in codecs_for(kv_dtype, torch.float32):
        y = codec.decode(codec.encode(x), torch.float32)
        errors.append(((x - y).abs().amax(-1) / x.abs().amax(-1)).max().item())
    print(f"{kv_dtype}: K {errors[0]:.4f}  V {errors[1]:.4f}")
    assert max(errors) <= ROUND_TRIP_BOUND[kv_dtype]


def test_zero_vectors_stay_zero():
    for kv_dtype in KV_DTYPES:
        for codec in codecs_for(kv_dtype, torch.float32):
            x = torch.zeros(3, 2, 32)
            assert torch.equal(codec.decode(codec.encode(x), torch.float32), x)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_paged_write_read_matches_direct_codec(kv_dtype):
    pool = PagePool(8, page_tokens=4)
    storage = KvStorage(pool, layers=2, heads=2, dim=32,
                        codecs=codecs_for(kv_dtype, torch.float32),
                        activation_dtype=torch.float32)
    a, b = storage.new_cache(), storage.new_cache()
    ka, kb = _rows(10, 2, 32, seed=1), _rows(10, 2, 32, seed=2)
    # interleaved growth gives both caches scattered page tables
    for start, n in [(0, 3), (3, 2), (5, 5)]:
        for cache, k in ((a, ka), (b, kb)):
            assert cache.reserve(start + n)
            cache.write(1, start, k[start:start + n], -k[start:start + n])
    assert a.pages != sorted(a.pages) or b.pages != list(range(min(b.pages), max(b.pages) + 1))
    k_codec, v_codec = storage.k_codec, storage.v_codec
    for cache, k in ((a, ka), (b, kb)):
        keys, values = cache.read(1, 10)
        assert torch.equal(keys, k_codec.decode(k_codec.encode(k), torch.float32))
        assert torch.equal(values, v_codec.decode(v_codec.encode(-k), torch.float32))
    a.release()
    b.release()
    assert pool.free == pool.total
