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
from ninfer_engine.codecs.kv import as_bits
from tests import tolerance
from tests.benchmark.tiny import tiny_config, tiny_source

from .helpers import DictWeights, error_chains, text_config, tiny_llama

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


def _replay_writes(storage, source, write_tols):
    """`storage`'s codecs store `source`'s rows at the slots they are given (the same slots:
    both pools allocate in the same order) instead of encoding their own, after checking that
    `source`'s decoded row is their input up to half a code step plus the K/V chain's rounding
    (`write_tols[layer]`, relative to each head vector's absmax). A quantizing codec can put
    inputs equal up to rounding noise one whole code step apart, so the two runs would
    otherwise attend over different K/V; this way they read the same codes, and the reads are
    what is compared."""
    for name, layers in (("k_codec", "k"), ("v_codec", "v")):
        codec, mine = getattr(storage, name), getattr(storage, layers)
        theirs = getattr(source, layers)

        def write(stored, slots, x, codec=codec, mine=mine, theirs=theirs):
            index = [id(layer) for layer in mine].index(id(stored))
            parts = tuple(as_bits(t).index_select(0, slots).view(t.dtype) for t in theirs[index])
            x = x.double()
            step = tolerance.code_step(codec.name) / 2 + write_tols[index]
            assert ((codec.decode(parts, torch.float64) - x).abs()
                    <= step * x.abs().amax(-1, keepdim=True)).all(), (index, name)
            for src, dst in zip(theirs[index], stored):
                as_bits(dst).index_copy_(0, slots, as_bits(src).index_select(0, slots))
        codec.write = write


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

    def run(source=None):
        storage = _storage(model, kv_dtype)
        if source is not None:
            _replay_writes(storage, source, write_tols)
        caches = [storage.new_cache(), storage.new_cache()]
        out = []
        for step in steps:
            ids = [t for seg, _ in step for t in seg]
            pos = [p for seg, s in step for p in range(s, s + len(seg))]
            segs = [Segment(c, s, len(seg)) for c, (seg, s) in zip(caches, step)]
            out.append(model.forward(torch.tensor(ids), torch.tensor(pos), segs,
                                     torch.arange(len(ids))))
        return out, storage

    # fp32 both ways: γ of the chain to each layer's K/V and to the logits (helpers.error_chains)
    writes, logits = error_chains(model, 131)
    write_tols = [tolerance.bound(torch.float32, depth) for depth, _ in writes]
    want, source = run()
    monkeypatch.setattr(llama_attention, "use_triton", lambda t: True)
    prefill = _spy(monkeypatch, llama_attention, "paged_prefill_varlen_triton")
    decode = _spy(monkeypatch, llama_attention, "paged_attention_triton")
    got, _ = run(source)
    layers = len(model.layers)
    assert len(prefill) == 2 * layers and len(decode) == layers  # one launch per layer
    for g, w in zip(got, want):
        assert _rel(g, w) < tolerance.bound(torch.float32, logits[0])


def _qwen35():
    config = tiny_config(False)
    return Qwen35Model(config, tiny_source(config, torch.float32))


def _qwen35_tol(context):
    """fp32 both ways. The tiny model is a GDN layer then the attention layer: everything
    before the attention is the same ops on the same inputs (the same K/V, bit for bit), so the
    runs differ from the attention on: the scores (D, times ‖q‖‖k‖/√D ≤ √D·max|w| for
    RMS-normed q, k, as the exp turns their absolute error relative), the softmax sum and P·V
    over the context, the online rescale per page, the output gate, the output projection,
    the residual, RMSNorm, the MLP, the final norm and the head."""
    cfg = tiny_config(False)
    H, I, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq = cfg["num_attention_heads"]
    spread = D ** 0.5 * 1.5 ** 2  # |1 + w| ≤ 1.5 for the synthetic zero-centred norm weights
    pages = -(-context // PAGE)
    depth = (D * spread + 2 * context + tolerance.TRANSCENDENTAL * (pages + 2) + 5 + nq * D + 1
             + H + H + I + 2 + H + H)
    return tolerance.bound(torch.float32, depth)


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
        assert _rel(g, w) < _qwen35_tol(131)


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
        assert _rel(g, w) < _qwen35_tol(20)


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
@torch.inference_mode()
def test_gated_attention_rows_planned_together_take_one_launch_a_layer(kv_dtype, monkeypatch):
    """The hybrid runner's CUDA steps of several rows: rows whose `LayerKv` views share the
    step's plans write their K/V in one scatter and attend in one varlen launch a layer, and
    give the logits of one launch a row (the same kernel tiles a query: bit for bit); a step of
    decode rows takes the split-K decode kernel once a layer, within the attention's fp32
    bound of one launch a row (another kernel: another summation order)."""
    model = _qwen35()
    gen = torch.Generator().manual_seed(14)
    a, b = (torch.randint(0, 512, (n,), generator=gen).tolist() for n in (131, 7))
    prompts = [[(a[:70], 0), (b[:5], 0)], [(a[70:130], 70), (b[5:6], 5)]]  # a page crossed
    steps = prompts + [[(a[130:131], 130), (b[6:7], 6)]]  # then a decode step

    def run(planned: bool):
        storage = _storage(model, kv_dtype)
        caches = [storage.new_cache(), storage.new_cache()]
        recurrent = [model.new_recurrent_state(), model.new_recurrent_state()]
        out = []
        for step in steps:
            assert all(c.reserve(s + len(ids)) for c, (ids, s) in zip(caches, step))
            segments = [Segment(c, s, len(ids)) for c, (ids, s) in zip(caches, step)]
            plans = llama_attention.plan_segments(segments, model.device) if planned else None
            states = [model.bind_state([LayerKv(c, j, s, plans)
                                        for j in range(len(model.attention_layers))], r, s)
                      for c, r, (_, s) in zip(caches, recurrent, step)]
            ids = torch.tensor([t for seg, _ in step for t in seg])
            out.append(model.forward_rows(ids, states, [len(seg) for seg, _ in step]))
        return out

    monkeypatch.setattr(gated_attention, "use_triton", lambda t: True)
    want = run(planned=False)
    together = _spy(monkeypatch, llama_attention, "paged_prefill_varlen_triton")
    decode = _spy(monkeypatch, llama_attention, "paged_attention_triton")
    alone = _spy(monkeypatch, gated_attention, "paged_prefill_triton")
    got = run(planned=True)
    layers = len(model.attention_layers)
    assert len(together) == len(prompts) * layers and len(decode) == layers and not alone
    for g, w in zip(got[: len(prompts)], want):
        assert torch.equal(g, w)
    assert _rel(got[-1], want[-1]) < _qwen35_tol(131)
