"""Prompt log-probabilities through the engine (issue 21: Completions `echo` + `logprobs`,
vLLM's `prompt_logprobs`), for a tiny llama and a tiny hybrid model: every prompt token's entry
is log_softmax of transformers' logits at the position before it, over a prompt cut into
several 64-token chunks, computed in full even when the prefix tree holds it, beside an
unscored request in the same steps."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import FakeArtifact, seeded_prompt, tiny_llama

GREEDY = SamplingParams(temperature=0.0)
TOP = 3


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def family(request):
    if request.param == "hybrid":
        pytest.importorskip("transformers.models.qwen3_5_moe")
        from .hybrid_helpers import HybridArtifact

        artifact = HybridArtifact("qwen3_5")
        return artifact, artifact.hf
    hf = tiny_llama(seed=7, vocab_size=259)
    return FakeArtifact(hf), hf


def _request(rid, prompt, max_tokens, scored):
    return GenerationRequest(rid, prompt, GREEDY, max_tokens, ignore_eos=True,
                             prompt_logprobs=TOP if scored else None,
                             prompt_logprob_sink=[] if scored else None)


async def _together(engine, requests):
    async def one(request):
        return [e async for e in engine.submit(request)]
    return await asyncio.gather(*(one(r) for r in requests))


def test_prompt_logprobs_are_log_softmax_of_the_reference_logits(family):
    artifact, hf = family
    prompt = seeded_prompt(150, 1)  # three chunks: 64, 64, 22
    with torch.inference_mode():
        reference = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    engine = Engine(EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=64,
                                 max_context=1024, cuda_dtype="fp32", device_state_slots=8),
                    artifact)
    engine.start()
    try:
        with torch.inference_mode():
            [warm] = asyncio.run(_together(engine, [_request("warm", prompt, 4, False)]))
            scored, plain, empty = _request("s", prompt, 4, True), \
                _request("p", seeded_prompt(90, 2), 4, False), _request("z", prompt, 0, True)
            got = asyncio.run(_together(engine, [scored, plain, empty]))
    finally:
        engine.stop()
    sink = scored.prompt_logprob_sink
    assert len(sink) == len(prompt) and [e.token for e in sink] == list(prompt)
    assert sink[0].logprob is None and sink[0].top == ()
    for j, entry in enumerate(sink[1:], start=1):
        row = reference[j - 1]
        assert entry.logprob == pytest.approx(row[prompt[j]].item(), abs=2e-4), j
        value = row[prompt[j]]  # rank within what the tolerance cannot order
        assert int((row > value + 2e-4).sum()) < entry.rank <= int((row > value - 2e-4).sum()) + 1
        values, ids = row.topk(TOP)
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=2e-4), j
    final = got[0][-1]
    assert final.finish == "length", final.error
    # computed in full although the warm request left the prompt in the prefix tree
    assert final.usage.cached_tokens == 0 and final.timings.prompt_n == len(prompt)
    tokens = [[t for e in events for t in e.token_ids] for events in (warm, got[0])]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 4  # the last prompt position sampled
    assert got[1][-1].finish == "length" and len([t for e in got[1] for t in e.token_ids]) == 4
    assert [t for e in got[2] for t in e.token_ids] == []  # max_tokens 0: scoring only
    assert [e.logprob for e in empty.prompt_logprob_sink] == [e.logprob for e in sink]
