"""The llama family over the paged pool: equal to the contiguous cache; KV dtype errors."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer_engine.kv import KV_DTYPES, KvStorage, LayerKv, PagePool, codecs_for
from ninfer_engine.codecs.kv import as_bits
from ninfer_engine.models import Segment, build_model
from ninfer_engine.models.gated_attention import GatedAttention

from tests import tolerance
from tests.models.qwen35_tiny import hybrid_depth

from .helpers import DictWeights, error_chains, text_config, tiny_llama
from .hybrid_helpers import HybridArtifact

F32 = torch.float32


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
    # fp32 both ways, the same K/V values (the plain codec stores fp32): γ of the chain
    tol = tolerance.bound(F32, error_chains(model, 46)[1][0])
    for paged, plain in zip(*outs):
        tolerance.assert_within(paged, plain, tol * plain.abs().max())
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
    # fp32 both ways, the same K/V values; the GDN layers before the first attention layer are
    # the same ops on the same inputs
    first = artifact.config("text")["layer_types"].index("full_attention")
    tol = tolerance.bound(F32, hybrid_depth(artifact.config("text"), 150, first))
    want = torch.cat(rows)
    tolerance.assert_within(paged, want, tol * want.abs().max())


def _attention_sensitivity(monkeypatch):
    """Records, per attention core call (one per attention layer and chunk, in order: the
    llama family's SDPA, the hybrid's `GatedAttention._attend`), S = scale·max‖q_head‖₁·max|k|:
    K moved by ≤ u·max|k| moves the softmax exponents by ≤ u·S, so each weight and the output
    by ≤ 2u·S relative; V moved by ≤ u·max|v| moves the output by ≤ u·max|v|."""
    calls = []
    sdpa, attend = F.scaled_dot_product_attention, GatedAttention._attend

    def record(q, k, scale):
        calls.append(scale * q.abs().sum(-1).max().item() * k.abs().max().item())

    def recorded_sdpa(q, k, v, *args, scale=None, **kw):
        record(q, k, q.shape[-1] ** -0.5 if scale is None else scale)
        # torch's CausalBias (the CUDA mask) takes the call only while F's attribute is the
        # real SDPA: it checks `func is F.scaled_dot_product_attention`
        F.scaled_dot_product_attention = sdpa
        try:
            return sdpa(q, k, v, *args, scale=scale, **kw)
        finally:  # (the monkeypatch's undo puts the real one back at the end)
            F.scaled_dot_product_attention = recorded_sdpa

    def recorded_attend(self, q, k, v, past):
        record(q, k, self.d ** -0.5)
        return attend(self, q, k, v, past)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded_sdpa)
    monkeypatch.setattr(GatedAttention, "_attend", recorded_attend)
    return calls


def _checked(storage):
    """The storage, its codecs checking every row they store: decoded, within half a code step
    of the row's absmax (`tolerance.code_step`) plus the decode's fp32 products (≤ 2)."""
    for codec in (storage.k_codec, storage.v_codec):
        def write(stored, slots, x, codec=codec, write=codec.write):
            write(stored, slots, x)
            parts = tuple(as_bits(t).index_select(0, slots).view(t.dtype) for t in stored)
            x = x.double()
            limit = tolerance.code_step(codec.name) / 2 + tolerance.gamma(F32, 2)
            assert ((codec.decode(parts, torch.float64) - x).abs()
                    <= limit * x.abs().amax(-1, keepdim=True)).all(), codec.name
        codec.write = write
    return storage


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@torch.inference_mode()
def test_kv_dtype_logit_errors(family, model, hybrid):
    """Each quantized KV dtype against the unquantized pool. A codec stores each K / V element
    within half a code step of its vector's absmax (`tolerance.code_step`): a rounding of
    unit u_K, u_V. Counted like every other rounding (`tests.tolerance`: relative, adding over
    the layers), an attention layer's output moves by u_V + 2·u_K·S (`_attention_sensitivity`,
    S measured on the unquantized run's q and k, not on any error), on top of both runs' fp32
    rounding over the chain. Rows whose top-1 margin exceeds twice the bound keep their top-1.
    That worst case is loose where S is large (the hybrid's RMS-normed q, k: a bound above 1
    for nvfp4), so every stored row is also checked against its codec's half step."""
    tokens = _tokens(160, seed=3)
    forward = _chunked if family == "llama" else _hybrid_chunked
    net = model if family == "llama" else hybrid[1]
    with pytest.MonkeyPatch.context() as patch:
        sensitivity = _attention_sensitivity(patch)
        ref = forward(net, _storage(net, "bf16").new_cache(), tokens, 16)
    chunks = -(-len(tokens) // 16)
    layers = len(sensitivity) // chunks  # attention layers: one SDPA call each per chunk
    per_chunk = [sensitivity[i * layers:(i + 1) * layers] for i in range(chunks)]
    if family == "llama":
        depth = error_chains(net, len(tokens))[1][0]
    else:
        depth = hybrid_depth(hybrid[0].config("text"), len(tokens))
    top2 = ref.topk(2, -1).values
    for kv_dtype in KV_DTYPES[1:]:
        k_codec, v_codec = codecs_for(kv_dtype, net.dtype)
        u_k = tolerance.code_step(k_codec.name) / 2
        u_v = tolerance.code_step(v_codec.name) / 2
        tol = tolerance.bound(F32, depth) + max(
            sum(u_v + 2 * u_k * s for s in chunk) for chunk in per_chunk)
        got = forward(net, _checked(_storage(net, kv_dtype)).new_cache(), tokens, 16)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        clear = top2[:, 0] - top2[:, 1] > 2 * tol * ref.abs().max()
        agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(f"{family} kv {kv_dtype}: max rel logit err {err:.4f} (bound {tol:.4f}), "
              f"top-1 agreement {agree:.3f}, {int(clear.sum())} rows with a clear top-1")
        assert err < tol, (kv_dtype, err, tol)
        assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear]), kv_dtype
