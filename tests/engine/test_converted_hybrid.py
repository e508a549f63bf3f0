"""Converted tiny Qwen3.5-family checkpoints served end to end (the hybrid engine's must-show).

For each of `qwen3_5`, `qwen3_5_moe` and `qwen3_next`: a tiny seeded HF model (model-math.md §7,
fp32, eager, every 1-D parameter randomised) is saved with `save_pretrained`, converted with the
real `ninfer convert hf --recipe fp32` CLI entry, and then

* the engine's model + `HybridRunner` over a paged KV pool and a recurrent-state slot prefill a
  200-token prompt in chunks of 64 + 64 + 72: each chunk's last-position logits are within
  γ of the fp32 chain (`qwen35_tiny.hybrid_depth`, relative: max|Δ| / max|HF|) of HF's one full
  forward over the same prefix;
* the real `Engine` on the artifact file (prefill chunks 64, 64, 64, 8) generates 64 greedy
  tokens equal to HF's greedy argmax loop (a full forward over the whole sequence each step,
  no HF cache).
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.artifact import open_artifact
from ninfer_engine.config import PAGE_TOKENS, EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.models import Qwen35Model, build_model
from ninfer_engine.step.families import make_runner
from ninfer_engine.step.family_runners import HybridRunner
from ninfer_engine.step.scheduler import Batch, Chunk
from ninfer_engine.cli.tools import main
from ninfer_engine.types import GenerationRequest, SamplingParams
from tests.models.qwen35_tiny import hf_model, hybrid_depth, rel_err
from tests.tolerance import bound

from .helpers import default_resources

pytest.importorskip("transformers.models.qwen3_5_moe")
pytest.importorskip("transformers.models.qwen3_next")

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
PROMPT_LEN, STEPS, CHUNKS = 200, 64, (64, 64, 72)
PROMPT = tuple(torch.randint(0, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7))
               .tolist())


def _hf_reference(hf) -> tuple[torch.Tensor, list[int]]:
    """HF's logits at every prompt position (one full forward) and its greedy continuation:
    argmax of a full forward over prompt + generated-so-far each step, no cache."""
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT]), use_cache=False).logits[0]
        tokens = [int(logits[-1].argmax())]
        for _ in range(STEPS - 1):
            out = hf(torch.tensor([[*PROMPT, *tokens]]), use_cache=False).logits[0, -1]
            tokens.append(int(out.argmax()))
    return logits, tokens


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """family -> (converted artifact path, HF prompt logits [200, V], HF greedy tokens)."""
    out = {}
    for family in FAMILIES:
        hf = hf_model(family)
        folder = tmp_path_factory.mktemp(family)
        hf.save_pretrained(folder, safe_serialization=True)
        for role, data in default_resources().items():  # the Engine needs a tokenizer
            (folder / role).write_bytes(data)
        artifact = tmp_path_factory.mktemp("converted") / f"{family}.ninfer"
        assert main(["convert", "hf", str(folder), "-o", str(artifact), "--recipe", "fp32"]) == 0
        out[family] = (artifact, *_hf_reference(hf))
    return out


def _chunked_prefill_logits(path, device) -> list[torch.Tensor]:
    """The engine's model and runner over the artifact on `device`: the 200-token prompt as
    prefill chunks of one sequence with a paged KV cache and a state slot; each chunk's
    last-row logits."""
    with open_artifact(path) as artifact:
        model = build_model(artifact.config("text"), artifact, device)
    runner = make_runner(model)
    assert isinstance(model, Qwen35Model) and isinstance(runner, HybridRunner)
    layers, heads, dim = model.kv_layout()
    storage = KvStorage(PagePool(-(-PROMPT_LEN // PAGE_TOKENS)), layers, heads, dim,
                        codecs_for("bf16", model.dtype), model.dtype, model.device)
    seq = SimpleNamespace(prompt=PROMPT, cached=0, cache=storage.new_cache(),
                          state=model.state_pool(1).acquire(), output=[])
    assert seq.cache.reserve(PROMPT_LEN)
    rows = []
    for n in CHUNKS:
        rows.append(runner.forward(Batch(decode=[], chunks=[Chunk(seq, n)],
                                         sampled=[seq]))[0])
    assert seq.cached == PROMPT_LEN
    return rows


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_logits_match_hf(family, cases, device):
    path, want, _ = cases[family]
    got = _chunked_prefill_logits(path, device)
    ends = [sum(CHUNKS[: i + 1]) for i in range(len(CHUNKS))]
    errors = [rel_err(row, want[end - 1]) for row, end in zip(got, ends)]
    print(f"\n{family}: last-position rel err after chunks {ends}: "
          + ", ".join(f"{e:.2e}" for e in errors))
    # fp32 both sides (the fp32 recipe): γ of the whole chain over the prompt, each side
    tolerance = bound(torch.float32, hybrid_depth(open_artifact(path).config("text"), PROMPT_LEN))
    assert max(errors) <= tolerance


async def _collect(engine, request):
    return [event async for event in engine.submit(request)]


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_equals_hf(family, cases):
    path, _, want = cases[family]
    engine = Engine(EngineConfig(artifact=path, prefill_chunk=64, max_context=512,
                                 cuda_dtype="fp32"))  # exact tokens vs fp32 transformers
    engine.start()
    try:
        request = GenerationRequest("r", PROMPT, SamplingParams(temperature=0.0), STEPS,
                                    ignore_eos=True)
        events = asyncio.run(_collect(engine, request))
    finally:
        engine.stop()
    ours = [i for e in events for i in e.token_ids]
    final = events[-1]
    first = next((i for i, (a, b) in enumerate(zip(ours, want)) if a != b), None)
    print(f"\n{family}: engine vs HF greedy, first difference at step {first}")
    assert final.finish == "length" and final.usage.prompt_tokens == PROMPT_LEN
    assert ours == want
    assert len(set(want)) > 8  # a varied continuation, not one repeated token
