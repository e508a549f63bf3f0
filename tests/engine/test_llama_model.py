"""Our llama-family forward against tiny random `transformers` models (model-math.md §8)."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.models import Segment, build_model

from tests.tolerance import bound

from .helpers import DictWeights, error_chains, text_config, tiny_llama, tiny_qwen3

STEPS = 40


def _tol(model, context):
    """fp32 both sides (ours, transformers' eager forward): γ of the chain to the logits
    (`helpers.error_chains`), relative to the largest |logit|."""
    return bound(torch.float32, error_chains(model, context)[1][0])


def _ours(hf, device, matmul_dtype=None):
    return build_model(text_config(hf), DictWeights.from_hf(hf), device, matmul_dtype=matmul_dtype)


def _prefill(model, cache, prompt: list[int], chunk: int) -> torch.Tensor:
    """The last prompt position's logits, on the CPU."""
    logits, on = None, model.device
    for start in range(0, len(prompt), chunk):
        ids = prompt[start:start + chunk]
        logits = model.forward(
            torch.tensor(ids, device=on), torch.arange(start, start + len(ids), device=on),
            [Segment(cache, start, len(ids))], torch.tensor([len(ids) - 1], device=on),
        )
    return logits[0].cpu()


def _greedy_ours(model, prompt: list[int], chunk: int) -> tuple[torch.Tensor, list[int]]:
    cache = model.new_cache()
    first = _prefill(model, cache, prompt, chunk)
    tokens, pos = [int(first.argmax())], len(prompt)
    for _ in range(STEPS - 1):
        on = model.device
        logits = model.forward(torch.tensor(tokens[-1:], device=on), torch.tensor([pos], device=on),
                               [Segment(cache, pos, 1)], torch.tensor([0], device=on))
        tokens.append(int(logits[0].argmax()))
        pos += 1
    return first, tokens


def _greedy_hf(hf, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Greedy by full uncached forwards: the plainest reference `transformers` offers."""
    ids = list(prompt)
    first = hf(torch.tensor([ids])).logits[0, -1]
    ids.append(int(first.argmax()))
    for _ in range(STEPS - 1):
        ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return first, ids[len(prompt):]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@torch.inference_mode()
def test_matches_transformers_with_chunked_prefill(family, device):
    hf = tiny_llama() if family == "llama" else tiny_qwen3()
    model = _ours(hf, device)
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(3)).tolist()
    ref_logits, ref_tokens = _greedy_hf(hf, prompt)
    for chunk in (37, 8):
        logits, tokens = _greedy_ours(model, prompt, chunk)
        diff = (logits - ref_logits).abs().max()
        assert diff <= _tol(model, len(prompt)) * ref_logits.abs().max(), diff
        assert tokens == ref_tokens


@torch.inference_mode()
def test_batched_decode_equals_alone(device):
    hf = tiny_llama(seed=5)
    model = _ours(hf, device)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (11, 29)]
    alone = [_greedy_ours(model, p, 16)[1] for p in prompts]

    caches = [model.new_cache() for _ in prompts]
    tokens = [[int(_prefill(model, c, p, 16).argmax())] for c, p in zip(caches, prompts)]
    positions = [len(p) for p in prompts]
    for _ in range(STEPS - 1):
        segments = [Segment(c, pos, 1) for c, pos in zip(caches, positions)]
        logits = model.forward(torch.tensor([t[-1] for t in tokens], device=device),
                               torch.tensor(positions, device=device), segments,
                               torch.arange(len(prompts), device=device))
        for row, t in enumerate(tokens):
            t.append(int(logits[row].argmax()))
        positions = [p + 1 for p in positions]
    assert tokens == alone


@torch.inference_mode()
def test_prefill_chunk_and_decode_in_one_forward(device):
    hf = tiny_llama(seed=9)
    model = _ours(hf, device)
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randint(0, 128, (n,), generator=gen).tolist() for n in (9, 20))
    cache_a, cache_b = model.new_cache(), model.new_cache()
    next_a = int(_prefill(model, cache_a, a, 9).argmax())
    _prefill(model, cache_b, b[:12], 12)
    # one step: a decodes its next token while b prefills its remaining 8 tokens
    logits = model.forward(
        torch.tensor([next_a, *b[12:]], device=device),
        torch.tensor([9, *range(12, 20)], device=device),
        [Segment(cache_a, 9, 1), Segment(cache_b, 12, 8)], torch.tensor([0, 8], device=device),
    ).cpu()
    ref_a = hf(torch.tensor([a + [next_a]])).logits[0, -1]
    ref_b = hf(torch.tensor([b])).logits[0, -1]
    for got, want in ((logits[0], ref_a), (logits[1], ref_b)):
        assert (got - want).abs().max() <= _tol(model, 20) * want.abs().max()


def test_bf16_matmuls_stay_close_to_fp32(device):
    """`--cpu-matmul bf16` decodes (few-row calls) with bf16 weights: logits stay close."""
    hf = tiny_llama(seed=3)
    prompt = list(range(1, 40))
    exact = _prefill(_ours(hf, device), _ours(hf, device).new_cache(), prompt, 16)
    fast_model = _ours(hf, device, torch.bfloat16)
    assert fast_model.layers[0].qkv.narrow.dtype == torch.bfloat16
    fast = _prefill(fast_model, fast_model.new_cache(), prompt, 16)
    assert fast.dtype == torch.float32
    error = ((fast - exact).abs().max() / exact.abs().max()).item()
    # the bf16 side casts the activations and the weights of every matmul to bf16 (QKV, output,
    # gate/up, down per layer, and the head: 2 roundings each, relative to the dot's terms);
    # the rest of both chains is fp32
    depth, _ = error_chains(fast_model, len(prompt))[1]
    matmuls = 4 * len(fast_model.layers) + 1
    tol = bound(torch.float32, depth, sides=1) + bound(torch.bfloat16, depth,
                                                      roundings=2 * matmuls, sides=1)
    assert 0 < error < tol, error  # and above 0: the bf16 copies are used
