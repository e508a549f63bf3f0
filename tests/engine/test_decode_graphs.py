"""The static-buffer decode step (`models.llama_step.StaticDecoder`) against the model's forward.

On the CPU the step runs eagerly through the kernels' torch references; on CUDA
(`NINFER_TEST_DEVICE=cuda`) it runs the Triton kernels and is replayed from captured graphs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.models.llama_step import StaticDecoder
from ninfer_engine.step.decode_graphs import DecodeGraphs, context_bucket
from ninfer_engine.step.families import build_decode_graphs
from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.models import Segment, build_model

from tests import tolerance

from .helpers import (DictWeights, copy_pool, error_chains, forward_rows, recorded_writes,
                      stored_rows, text_config, tiny_llama, tiny_qwen3)

PAGE = 64


def _model(family, device, dtype):
    hf = tiny_llama() if family == "llama" else tiny_qwen3()
    return build_model(text_config(hf), DictWeights.from_hf(hf), device, dtype)


def _storage(model, kv_dtype):
    layers, heads, dim = model.kv_layout()
    return KvStorage(PagePool(16, PAGE), layers, heads, dim, codecs_for(kv_dtype, model.dtype),
                     model.dtype, model.device)


def _prefilled(model, storage, prompt):
    """A sequence stand-in (what `StaticDecoder.load` reads) whose prompt is in the pool."""
    cache = storage.new_cache()
    on = model.device
    logits = model.forward(torch.tensor(prompt, device=on), torch.arange(len(prompt), device=on),
                           [Segment(cache, 0, len(prompt))],
                           torch.tensor([len(prompt) - 1], device=on))
    return SimpleNamespace(cache=cache, cached=len(prompt), output=[int(logits[0].argmax())])


def _eager_step(model, seqs):
    """The reference: one flat forward with a one-token segment per sequence."""
    on = model.device
    for seq in seqs:
        assert seq.cache.reserve(seq.cached + 1)
    logits = model.forward(
        torch.tensor([s.output[-1] for s in seqs], device=on),
        torch.tensor([s.cached for s in seqs], device=on),
        [Segment(s.cache, s.cached, 1) for s in seqs], torch.arange(len(seqs), device=on))
    for seq in seqs:
        seq.cached += 1
    return logits


# prompt lengths that start decode mid-page, at a page's last slot and on a fresh page
LENGTHS = (5, 63, 64)
STEPS = 70  # crosses a page boundary for every sequence


@pytest.mark.parametrize("family,kv_dtype,half", [
    ("llama", "bf16", False), ("llama", "int8", False), ("qwen3", "bf16", False),
    ("qwen3", "int8", False), ("llama", "bf16", True), ("qwen3", "int8", True),
    ("llama", "fp8", False), ("qwen3", "nvfp4", False), ("llama", "k8v4", True)])
@torch.inference_mode()
def test_static_decode_matches_the_model_forward(family, kv_dtype, half, device):
    """fp32 is the CPU path; bf16 is what CUDA serves (run here too, through the references).

    A quantizing codec is discontinuous: K/V that the two paths compute equal up to rounding
    noise can land on neighbouring codes, a whole code step apart, which no float tolerance on
    the logits bounds. So each step is checked in two parts: the rows the static step stored
    must be the reference's own K/V up to half a code step plus rounding noise; and the
    reference then attends over exactly the pool the static step left (its own writes are
    recorded, not stored), so the logits differ by rounding noise alone. The prompts are
    prefilled by the model's forward into both pools, so by induction every row either path
    reads is checked."""
    dtype = torch.bfloat16 if half or device.type == "cuda" else torch.float32
    model = _model(family, device, dtype)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in LENGTHS]
    ours_storage, ref_storage = _storage(model, kv_dtype), _storage(model, kv_dtype)
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    graphs = DecodeGraphs(StaticDecoder(model, ours_storage, 3, 512),
                          capture=device.type == "cuda")
    writes, logits = error_chains(model, max(LENGTHS) + STEPS)
    # both paths compute K/V and logits in `dtype`: each side within its own γ (tests.tolerance)
    write_tol = [tolerance.bound(dtype, depth, roundings=r) for depth, r in writes]
    logit_tol = tolerance.bound(dtype, logits[0], roundings=logits[1])
    steps = {codec.name: tolerance.code_step(codec.name)
             for codec in (ref_storage.k_codec, ref_storage.v_codec)}
    for step in range(STEPS):
        for seq in ours:
            assert seq.cache.reserve(seq.cached + 1)
        got = graphs.forward(ours).clone()
        for a, b in zip(ours, ref):
            assert b.cache.reserve(b.cached + 1) and a.cache.pages == b.cache.pages
        copy_pool(ours_storage, ref_storage)
        with recorded_writes(ref_storage) as written:
            want = _eager_step(model, ref)
        page = ref_storage.page_tokens
        slots = sorted(s.cache.pages[(s.cached - 1) // page] * page + (s.cached - 1) % page
                       for s in ref)  # each row's new position, written once per layer and K/V
        for index in range(len(model.layers)):
            for is_k in (True, False):
                assert sorted(t for i, k, at, _ in written if (i, k) == (index, is_k)
                              for t in at.tolist()) == slots
        for index, is_k, slots, x in written:
            codec = ref_storage.k_codec if is_k else ref_storage.v_codec
            stored, x = stored_rows(ours_storage, index, is_k, slots), x.double()
            absmax = x.abs().amax(-1, keepdim=True)
            # |Q(x_ours) − x_ref| ≤ half a code step of x_ours + |x_ours − x_ref|
            limit = (steps[codec.name] / 2 + write_tol[index]) * absmax
            assert ((stored - x).abs() <= limit).all(), (step, index, "KV"[not is_k])
        scale = want.abs().max()
        assert (got - want).abs().max() <= logit_tol * scale, f"step {step}"
        for row, (a, b) in enumerate(zip(ours, ref)):  # both continue with the same token
            token = int(want[row].argmax())
            a.output.append(token)
            b.output.append(token)
    assert [s.cached for s in ours] == [n + STEPS for n in LENGTHS]


@torch.inference_mode()
def test_a_batch_smaller_than_the_buffers_uses_the_first_rows(device):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _model("llama", device, dtype)
    storage = _storage(model, "bf16")
    seq = _prefilled(model, storage, list(range(10)))
    ref = _prefilled(model, _storage(model, "bf16"), list(range(10)))
    graphs = DecodeGraphs(StaticDecoder(model, storage, 8, 512), capture=device.type == "cuda")
    assert seq.cache.reserve(11)
    got = graphs.forward([seq])
    assert got.shape == (1, model.vocab_size)
    want = _eager_step(model, [ref])
    assert int(got[0].argmax()) == int(want[0].argmax())


def test_context_buckets_double_from_1k_up_to_the_max_context():
    assert context_bucket(1, 8192) == 1024
    assert context_bucket(1024, 8192) == 1024
    assert context_bucket(1025, 8192) == 2048
    assert context_bucket(5000, 8192) == 8192
    assert context_bucket(9000, 12000) == 12000
    assert context_bucket(100, 512) == 512


def test_the_static_path_is_only_built_for_cuda_half_precision_llama_models():
    model = _model("llama", torch.device("cpu"), torch.float32)
    memory = SimpleNamespace(storage=_storage(model, "bf16"), running_slots=None)
    assert build_decode_graphs(model, memory, "bf16", 4, 512, True) is None


@pytest.mark.parametrize("k", [1, 3])
@torch.inference_mode()
def test_a_verify_row_gives_the_forwards_logits_at_each_position_then_decodes_on(k, device):
    """Verify rows (a row's last token and k drafts, as k + 1 query rows each over its
    sequence's pages up to its own position) against the model's forward over the same tokens,
    within the decode step's logit bound; each row then keeps part of its tokens and the next
    decode step, over the K/V the verify step left, matches the forward again. On CUDA the
    verify shape replays its own graph."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _model("llama", device, dtype)
    ours_storage, ref_storage = _storage(model, "bf16"), _storage(model, "bf16")
    gen = torch.Generator().manual_seed(13)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in LENGTHS]
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    drafts = [torch.randint(0, 128, (k,), generator=gen).tolist() for _ in prompts]
    graphs = DecodeGraphs(StaticDecoder(model, ours_storage, 3, 512, max_q=1 + k),
                          capture=device.type == "cuda")
    assert graphs.verifies(drafts) and not graphs.verifies([[0] * (k + 1)] * 3)
    for a, b in zip(ours, ref):
        assert a.cache.reserve(a.cached + 1 + k) and b.cache.reserve(b.cached + 1 + k)
    got = graphs.verify(ours, drafts).clone()
    assert got.shape == (3, 1 + k, model.vocab_size)
    assert [s.cached for s in ours] == list(LENGTHS)  # `keep` settles them
    want = forward_rows(model, ref, drafts).view(3, 1 + k, -1)
    _, (depth, roundings) = error_chains(model, max(LENGTHS) + 1 + k)
    limit = tolerance.bound(dtype, depth, roundings=roundings)
    assert (got - want).abs().max() <= limit * want.abs().max()
    kept = [1, k + 1, max(1, k - 1)]
    graphs.keep(ours, kept)
    for row, (a, b, n) in enumerate(zip(ours, ref, kept)):
        b.cached += n
        assert a.cached == b.cached
        token = int(want[row, n - 1].argmax())  # the target's token after the kept ones
        a.output.append(token)
        b.output.append(token)
        assert a.cache.reserve(a.cached + 1)
    got = graphs.forward(ours)
    assert (got - _eager_step(model, ref)).abs().max() <= limit * got.abs().max()


@torch.inference_mode()
def test_the_llama_runner_verifies_drafts_in_the_static_step(monkeypatch, device):
    """`Runner` with a static step of `max_q` 3: rows with 2 and 0 drafts are one padded
    verify step there (the eager forward is not called) with the eager runner's logits, and
    `keep` advances each row by what it kept."""
    from ninfer_engine.step.family_runners import Runner
    from ninfer_engine.step.scheduler import Batch

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _model("llama", device, dtype)
    gen = torch.Generator().manual_seed(17)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (9, 40)]
    drafts = [torch.randint(0, 128, (2,), generator=gen).tolist(), []]
    sides = []
    for static in (True, False):
        storage = _storage(model, "bf16")
        seqs = [_prefilled(model, storage, p) for p in prompts]
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + 3)
        graphs = DecodeGraphs(StaticDecoder(model, storage, 2, 512, max_q=3),
                              capture=device.type == "cuda") if static else None
        runner = Runner(model, graphs)
        eager = []
        monkeypatch.setattr(runner, "_eager", lambda work, sampled, f=runner._eager: (
            eager.append(len(work)), f(work, sampled))[1])
        batch = Batch(seqs, [], list(seqs), drafts)
        logits = runner.forward(batch)
        runner.keep(batch, [2, 1])
        sides.append((logits, [s.cached for s in seqs], eager))
    (got, cached, eager), (want, cached_ref, eager_ref) = sides
    assert eager == [] and eager_ref == [2]
    assert got.shape == want.shape == (3 + 1, model.vocab_size)
    assert cached == cached_ref == [9 + 2, 40 + 1]
    _, (depth, roundings) = error_chains(model, 40 + 3)
    limit = tolerance.bound(dtype, depth, roundings=roundings)
    assert (got - want).abs().max() <= limit * want.abs().max()
