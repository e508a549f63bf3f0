"""The llama family over the paged pool: equal to the contiguous cache; KV dtype errors."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.kv import KV_DTYPES, KvStorage, LayerKv, PagePool, codecs_for
from ninfer_engine.models import Segment, build_model

from .helpers import DictWeights, text_config, tiny_llama
from .hybrid_helpers import HybridArtifact

# max |Δlogit| / max |logit| vs unquantized KV over a 160-token chunked forward, with margin
# over the measured values (llama tiny: int8 0.0017, fp8 0.0097, nvfp4 0.032, k8v4 0.032;
# qwen3_5 tiny: int8 0.0018, fp8 0.0081, nvfp4 0.037, k8v4 0.024)
LOGIT_BOUND = {"int8": 0.005, "fp8": 0.03, "nvfp4": 0.1, "k8v4": 0.1}


@pytest.fixture(scope="module")
def model(device):
    hf = tiny_llama(seed=5, num_attention_heads=2, num_key_value_heads=1)  # head_dim 32
    return build_model(text_config(hf), DictWeights.from_hf(hf), device)


def _storage(model, kv_dtype="bf16", pages=64, page_tokens=8) -> KvStorage:
    layers, heads, dim = model.kv_layout()
    return KvStorage(PagePool(pages, page_tokens), layers, heads, dim,
                     codecs_for(kv_dtype, model.dtype), model.dtype, model.device)


def _chunked(model, cache, tokens: list[int], chunk: int) -> torch.Tensor:
    """Logits of every position, prefilling `chunk` tokens per forward."""
    rows, on = [], model.device
    for start in range(0, len(tokens), chunk):
        ids = tokens[start:start + chunk]
        rows.append(model.forward(torch.tensor(ids, device=on),
                                  torch.arange(start, start + len(ids), device=on),
                                  [Segment(cache, start, len(ids))],
                                  torch.arange(len(ids), device=on)))
    return torch.cat(rows)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
def test_paged_equals_contiguous_batched(model, device):
    storage = _storage(model)
    prompts = [_tokens(n, seed) for n, seed in ((29, 1), (45, 2))]
    caches = [storage.new_cache() for _ in prompts]
    contiguous = [model.new_cache() for _ in prompts]
    outs = [[], []]
    for cache_set, out in ((caches, outs[0]), (contiguous, outs[1])):
        # alternate the two prompts chunk by chunk, so their page tables interleave
        for start in range(0, 48, 16):
            for cache, prompt in zip(cache_set, prompts):
                ids = prompt[start:start + 16]
                if ids:
                    out.append(model.forward(
                        torch.tensor(ids, device=device),
                        torch.arange(start, start + len(ids), device=device),
                        [Segment(cache, start, len(ids))], torch.arange(len(ids), device=device)))
        # one batched forward continuing both, one token each
        positions = [len(p) for p in prompts]
        out.append(model.forward(torch.tensor([7, 9], device=device),
                                 torch.tensor(positions, device=device),
                                 [Segment(c, pos, 1) for c, pos in zip(cache_set, positions)],
                                 torch.arange(2, device=device)))
    assert any(b - a != 1 for a, b in zip(caches[0].pages, caches[0].pages[1:]))  # scattered
    for paged, plain in zip(*outs):
        torch.testing.assert_close(paged, plain, rtol=0, atol=1e-6)
    for cache in caches:
        cache.release()
    assert storage.allocator.free == storage.allocator.total


def _hybrid_chunked(model, cache, tokens: list[int], chunk: int) -> torch.Tensor:
    """The hybrid model's logits of every position, attention layers on the paged pool."""
    assert cache.reserve(len(tokens))
    recurrent, rows = model.new_recurrent_state(), []
    for start in range(0, len(tokens), chunk):
        views = [LayerKv(cache, layer, start) for layer in range(model.kv_layout()[0])]
        state = model.bind_state(views, recurrent, start)
        rows.append(model.forward(torch.tensor(tokens[start:start + chunk],
                                               device=model.device), state))
    return torch.cat(rows)


@pytest.fixture(scope="module")
def hybrid(device):
    artifact = HybridArtifact("qwen3_5")
    return artifact, build_model(artifact.config("text"), artifact, device)


@torch.inference_mode()
def test_hybrid_paged_equals_contiguous_state(hybrid, device):
    artifact, model = hybrid
    tokens = _tokens(150, seed=4)
    paged = _hybrid_chunked(model, _storage(model).new_cache(), tokens, 64)
    state, rows = model.new_state(), []
    for start in range(0, 150, 64):
        rows.append(model.forward(torch.tensor(tokens[start:start + 64], device=device), state))
    torch.testing.assert_close(paged, torch.cat(rows), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@torch.inference_mode()
def test_kv_dtype_logit_errors(family, model, hybrid):
    tokens = _tokens(160, seed=3)
    forward = _chunked if family == "llama" else _hybrid_chunked
    net = model if family == "llama" else hybrid[1]
    ref = forward(net, _storage(net, "bf16").new_cache(), tokens, 16)
    report = {}
    for kv_dtype in KV_DTYPES[1:]:
        got = forward(net, _storage(net, kv_dtype).new_cache(), tokens, 16)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        report[kv_dtype] = (err, agree)
        print(f"{family} kv {kv_dtype}: max rel logit err {err:.4f}, top-1 agreement {agree:.3f}")
    for kv_dtype, (err, agree) in report.items():
        assert err < LOGIT_BOUND[kv_dtype], (kv_dtype, err)
        assert agree > 0.95, (kv_dtype, agree)
