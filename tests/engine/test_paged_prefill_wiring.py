"""The models' CUDA attention paths, forced on the CPU: prefill chunks (and decode rows) attend
over the paged pool in place (`kernels.paged_prefill` through the Triton interpreter, the
models' `use_triton` patched to True), for every KV dtype, and must match the default CPU path
(which decodes the pages through the codecs).

Llama family: `models.attention.attend` (one varlen launch for a mixed batch, the decode kernel
for a pure-decode batch). Qwen3.5 family: `GatedAttention` over `kv.LayerKv` views, and its SDPA
path over the contiguous `KVCache`.
"""
from __future__ import annotations

import pytest
import torch

import ninfer_engine.models.attention as llama_attention
import ninfer_engine.models.gated_attention as gated_attention
from ninfer_engine.kernels._dispatch import HAVE_TRITON, interpreting
from ninfer_engine.kv import KV_DTYPES, KvStorage, LayerKv, PagePool, codecs_for
from ninfer_engine.models import Segment, build_model
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.benchmark.tiny import tiny_config, tiny_source

from .helpers import DictWeights, text_config, tiny_llama

PAGE = 64

# fp32 tiny models with the dispatch forced: only the interpreter runs the kernels in fp32
# (on CUDA they take bf16, and the engine's CUDA tests cover the path there)
pytestmark = pytest.mark.skipif(not HAVE_TRITON or not interpreting(),
                                reason="forces the Triton path under TRITON_INTERPRET=1")


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _storage(model, kv_dtype):
    layers, heads, dim = model.kv_layout()
    return KvStorage(PagePool(8, PAGE), layers, heads, dim, codecs_for(kv_dtype, model.dtype),
                     model.dtype, model.device)


def _spy(monkeypatch, module, name):
    """Count calls of `module.name` (still calling through)."""
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@torch.inference_mode()
def test_llama_attend_in_place_matches_the_gather_path(kv_dtype, monkeypatch):
    # nvfp4 K at head dim 16 stays off the kernels (`KvStorage.kernel_layout`): head dim 32
    heads = dict(num_attention_heads=2, num_key_value_heads=1) if kv_dtype == "nvfp4" else {}
    hf = tiny_llama(**heads)
    model = build_model(text_config(hf), DictWeights.from_hf(hf))
    gen = torch.Generator().manual_seed(11)
    a, b = (torch.randint(0, 128, (n,), generator=gen).tolist() for n in (140, 8))
    # (token ids, start) per segment, per forward: a long prefill with a short one; a chunk
    # crossing a page boundary with a decode row; a pure-decode batch
    steps = [[(a[:70], 0), (b[:5], 0)], [(a[70:130], 70), (b[5:6], 5)],
             [(a[130:131], 130), (b[6:7], 6)]]

    def run():
        storage = _storage(model, kv_dtype)
        caches = [storage.new_cache(), storage.new_cache()]
        out = []
        for step in steps:
            ids = [t for seg, _ in step for t in seg]
            pos = [p for seg, s in step for p in range(s, s + len(seg))]
            segs = [Segment(c, s, len(seg)) for c, (seg, s) in zip(caches, step)]
            out.append(model.forward(torch.tensor(ids), torch.tensor(pos), segs,
                                     torch.arange(len(ids))))
        return out

    want = run()
    monkeypatch.setattr(llama_attention, "use_triton", lambda t: True)
    prefill = _spy(monkeypatch, llama_attention, "paged_prefill_varlen_triton")
    decode = _spy(monkeypatch, llama_attention, "paged_attention_triton")
    got = run()
    layers = len(model.layers)
    assert len(prefill) == 2 * layers and len(decode) == layers  # one launch per layer
    for g, w in zip(got, want):
        assert _rel(g, w) < 1e-4


def _qwen35():
    config = tiny_config(False)
    return Qwen35Model(config, tiny_source(config, torch.float32))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@torch.inference_mode()
def test_gated_attention_in_place_matches_the_gather_path(kv_dtype, monkeypatch):
    model = _qwen35()
    gen = torch.Generator().manual_seed(12)
    ids = torch.randint(0, 512, (131,), generator=gen)
    chunks = [(0, 70), (70, 130), (130, 131)]  # prefill, a chunk crossing a page, a decode

    def run():
        storage = _storage(model, kv_dtype)
        cache = storage.new_cache()
        recurrent = model.new_recurrent_state()
        out = []
        for lo, hi in chunks:
            assert cache.reserve(hi)
            views = [LayerKv(cache, j, lo) for j in range(len(model.attention_layers))]
            state = model.bind_state(views, recurrent, lo)
            out.append(model.forward(ids[lo:hi], state))
        return out

    want = run()
    monkeypatch.setattr(gated_attention, "use_triton", lambda t: True)
    calls = _spy(monkeypatch, gated_attention, "paged_prefill_triton")
    got = run()
    assert len(calls) == len(chunks) * len(model.attention_layers)
    for g, w in zip(got, want):
        assert _rel(g, w) < 1e-4


@torch.inference_mode()
def test_gated_attention_sdpa_over_a_contiguous_cache(monkeypatch):
    """The non-paged CUDA path (SDPA with the bottom-right causal mask) on chunked input."""
    model = _qwen35()
    gen = torch.Generator().manual_seed(13)
    ids = torch.randint(0, 512, (20,), generator=gen)

    def run():
        state = model.new_state()
        return [model.forward(ids[lo:hi], state) for lo, hi in [(0, 9), (9, 19), (19, 20)]]

    want = run()
    monkeypatch.setattr(gated_attention, "use_triton", lambda t: True)
    calls = _spy(monkeypatch, gated_attention, "paged_prefill_triton")
    got = run()
    assert not calls
    for g, w in zip(got, want):
        assert _rel(g, w) < 1e-4
