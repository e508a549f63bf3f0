"""The static-buffer decode step (`decode_graphs.StaticDecoder`) against the model's own forward.

On the CPU the step runs eagerly through the kernels' torch references; on CUDA
(`NINFER_TEST_DEVICE=cuda`) it runs the Triton kernels and is replayed from captured graphs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.decode_graphs import (DecodeGraphs, StaticDecoder, build_decode_graphs,
                                         context_bucket)
from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.models import Segment, build_model

from .helpers import DictWeights, text_config, tiny_llama, tiny_qwen3

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


@pytest.mark.parametrize("family,kv_dtype,half", [
    ("llama", "bf16", False), ("llama", "int8", False), ("qwen3", "bf16", False),
    ("qwen3", "int8", False), ("llama", "bf16", True), ("qwen3", "int8", True),
    ("llama", "fp8", False), ("qwen3", "nvfp4", False), ("llama", "k8v4", True)])
@torch.inference_mode()
def test_static_decode_matches_the_model_forward(family, kv_dtype, half, device):
    """fp32 is the CPU path; bf16 is what CUDA serves (run here too, through the references)."""
    dtype = torch.bfloat16 if half or device.type == "cuda" else torch.float32
    model = _model(family, device, dtype)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in LENGTHS]
    ours_storage, ref_storage = _storage(model, kv_dtype), _storage(model, kv_dtype)
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    graphs = DecodeGraphs(StaticDecoder(model, ours_storage, 3, 512),
                          capture=device.type == "cuda")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for step in range(70):  # crosses a page boundary for every sequence
        for seq in ours:
            assert seq.cache.reserve(seq.cached + 1)
        got = graphs.forward(ours).clone()
        want = _eager_step(model, ref)
        scale = want.abs().max()
        assert (got - want).abs().max() <= tol * scale, f"step {step}"
        for row, (a, b) in enumerate(zip(ours, ref)):  # both continue with the same token
            token = int(want[row].argmax())
            a.output.append(token)
            b.output.append(token)
    assert [s.cached for s in ours] == [n + 70 for n in LENGTHS]


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
    storage = _storage(model, "bf16")
    assert build_decode_graphs(model, storage, "bf16", 4, 512, True) is None
