"""The compiled CPU decode step (`models.llama_cpu_step.CpuDecoder`, `kernels/cpu_decode.c`)
against the model's own eager forward, on a tiny llama whose projections are stored as Q8 groups.
"""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.codecs import encodings
from ninfer_engine.kernels.cpu_decode import cpu_decode_unavailable
from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.models import build_model
from ninfer_engine.models.llama_cpu_step import Q8, CpuDecoder, cpu_decoder
from ninfer_engine.step.decode_graphs import DecodeGraphs
from ninfer_engine.step.family_runners import Runner

from tests import tolerance

from .helpers import (DictWeights, FakeArtifact, copy_pool, error_chains, forward_rows,
                      text_config, tiny_llama)
from .test_decode_graphs import LENGTHS, STEPS, _eager_step, _prefilled

pytestmark = pytest.mark.skipif(cpu_decode_unavailable() is not None,
                                reason=f"{cpu_decode_unavailable()}")


class Q8Weights:
    """A tiny model's weights as an artifact stores them: matrices encoded as Q8 groups
    (`parameter` decodes them, `row_parts` hands over the encoded bytes), vectors fp32."""

    def __init__(self, hf) -> None:
        self.dense = DictWeights.from_hf(hf).tensors
        self.stored = {name: encodings.encode(Q8, t) for name, t in self.dense.items()
                       if t.dim() == 2}

    def has_parameter(self, name: str) -> bool:
        return name in self.dense

    def parameter(self, name, shape, dtype=torch.float32):
        if name in self.stored:
            return encodings.decode(Q8, self.stored[name], list(shape)).to(dtype)
        return self.dense[name].to(dtype)

    def row_parts(self, name, shape):
        if name not in self.stored:
            return None
        raw = torch.frombuffer(bytearray(self.stored[name]), dtype=torch.uint8)
        return [(Q8, tuple(shape), 0, shape[0], raw)]


def _setup(**overrides):
    hf = tiny_llama(**overrides)
    weights = Q8Weights(hf)
    model = build_model(text_config(hf), weights)
    layers, heads, dim = model.kv_layout()

    def storage():
        return KvStorage(PagePool(16, 64), layers, heads, dim, codecs_for("bf16", model.dtype),
                         model.dtype)
    return model, weights, storage


# a quantized GEMV input moves each element by up to half a code step of its block's absmax:
# one rounding of that unit (tests/tolerance.py's codec convention), in fp32 roundings
HALF_STEP = {"fp32": 0, "int16": 1 / (2 * 32767), "int8": 1 / (2 * 127)}


def _limit(model, context: int, activations: str) -> float:
    """The relative bound on the C step's logits against the eager fp32 forward's: fp32
    rounding over the model's error chains up to `context`, the two exps a layer takes
    (softmax, SiLU) from another libm (≤ 2 ulp each side), and, for quantized GEMV inputs, one
    rounding of their code step per projection input (4 a layer and the head's)."""
    _, (depth, _) = error_chains(model, context)
    depth += 2 * tolerance.TRANSCENDENTAL * len(model.layers)
    inputs = 4 * len(model.layers) + 1
    depth += inputs * HALF_STEP[activations] / tolerance.unit_roundoff(torch.float32)
    return tolerance.bound(torch.float32, depth)


@pytest.mark.parametrize("activations", list(HALF_STEP))
@pytest.mark.parametrize("lengths", [LENGTHS, LENGTHS[:1]])  # batch 3, and the one-row kernel
@torch.inference_mode()
def test_compiled_step_matches_the_model_forward(lengths, activations):
    """Each step's logits equal the eager fp32 forward's up to fp32 rounding (the same stored
    weight values, another summation order) and, for quantized GEMV inputs, one rounding of
    their code step per projection input (4 a layer and the head's): both read the same pool
    (the reference's is copied from ours before each step, so every K/V row the C step wrote
    is read back), and every row continues with the reference's greedy token. Prompts start
    decode mid-page, at a page's last slot and on a fresh page, and 70 steps cross a page
    boundary."""
    model, weights, storage = _setup()
    ours_storage, ref_storage = storage(), storage()
    decoder = cpu_decoder(model, ours_storage, 3, 512, weights, activations)
    assert isinstance(decoder, CpuDecoder), decoder
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    graphs = DecodeGraphs(decoder, capture=False)
    limit = _limit(model, max(lengths) + STEPS, activations)
    for step in range(STEPS):
        for a, b in zip(ours, ref):
            assert a.cache.reserve(a.cached + 1) and b.cache.reserve(b.cached + 1)
        got = graphs.forward(ours).clone()
        copy_pool(ours_storage, ref_storage)
        want = _eager_step(model, ref)
        assert (got - want).abs().max() <= limit * want.abs().max(), f"step {step}"
        for row, (a, b) in enumerate(zip(ours, ref)):
            token = int(want[row].argmax())
            a.output.append(token)
            b.output.append(token)
    assert [s.cached for s in ours] == [n + STEPS for n in lengths]


@pytest.mark.parametrize("activations", ["fp32", "int8"])
@torch.inference_mode()
def test_verify_rows_match_the_model_forward(activations):
    """A step of verify rows (a row's token and its drafts as consecutive rows of the C step,
    rows of 4, 1 and 3 tokens) gives each position's logits as the eager forward of the same
    tokens does, within the decode step's bound; each row then keeps part of its tokens and
    the next plain step, over the K/V the verify step left, matches the reference again."""
    model, weights, storage = _setup()
    ours_storage, ref_storage = storage(), storage()
    decoder = cpu_decoder(model, ours_storage, 3, 512, weights, activations, max_q=4)
    assert isinstance(decoder, CpuDecoder), decoder
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in LENGTHS]
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    drafts = [torch.randint(0, 128, (k,), generator=gen).tolist() for k in (3, 0, 2)]
    graphs = DecodeGraphs(decoder, capture=False)
    assert graphs.verifies(drafts) and not graphs.verifies([[0] * 4] + drafts[1:])
    for a, b, d in zip(ours, ref, drafts):
        assert a.cache.reserve(a.cached + 1 + len(d)) and b.cache.reserve(b.cached + 1 + len(d))
    got = graphs.verify_rows(ours, drafts).clone()
    rows = [[s.output[-1], *d] for s, d in zip(ref, drafts)]
    want = forward_rows(model, ref, drafts)
    limit = _limit(model, max(LENGTHS) + 4, activations)
    assert got.shape == want.shape == (8, model.vocab_size)
    assert (got - want).abs().max() <= limit * want.abs().max()
    kept, start = [2, 1, 3], 0
    graphs.keep(ours, kept)
    for a, b, r, n in zip(ours, ref, rows, kept):
        token = int(want[start + n - 1].argmax())  # the target's token after the kept ones
        start += len(r)
        b.cached += n
        assert a.cached == b.cached
        a.output.append(token)
        b.output.append(token)
        assert a.cache.reserve(a.cached + 1)
    got = graphs.forward(ours)
    assert (got - _eager_step(model, ref)).abs().max() <= limit * got.abs().max()


def test_the_step_multiplies_by_the_stored_values():
    """The Q8 codes and scales the C step reads are the artifact's, and decode to exactly the
    fp32 weights the eager path multiplies by."""
    model, weights, storage = _setup()
    decoder = cpu_decoder(model, storage(), 1, 128, weights)
    layers, head = decoder._keep
    shape = (model.cfg.hidden_size, model.cfg.intermediate_size)
    assert torch.equal(head.dequantize(), model.embedding)
    assert torch.equal(layers[1]["down"].dequantize(),
                       weights.parameter("text/layers/1/mlp/down", shape))


def test_no_compiled_step_where_it_would_not_be_the_stored_weights():
    """Dense weights (nothing stored as Q8), quantized KV or Q/K norms: the eager step, and
    the reason says why."""
    model, weights, storage = _setup()
    assert "Q8" in cpu_decoder(model, storage(), 1, 128, DictWeights(weights.dense))
    layers, heads, dim = model.kv_layout()
    int8_kv = KvStorage(PagePool(4, 64), layers, heads, dim, codecs_for("int8", model.dtype),
                        model.dtype)
    assert "unquantized KV" in cpu_decoder(model, int8_kv, 1, 128, weights)


def test_draft_cap_keeps_a_verify_step_within_the_rows():
    """Each row of a `batch`-row step gets an equal share of the step's 16 rows, at most
    `max_q`; a batch the step does not take has no cap (it runs eagerly anyway)."""
    model, weights, storage = _setup()
    graphs = DecodeGraphs(cpu_decoder(model, storage(), 8, 128, weights, max_q=4), False)
    assert [graphs.draft_cap(b) for b in (1, 4, 5, 8, 9)] == [3, 3, 2, 1, None]


class Q8Artifact(FakeArtifact):
    """A tiny llama as an artifact with its matrices stored as Q8 groups (the compiled step's)."""

    def __init__(self, hf) -> None:
        super().__init__(hf)
        self._weights = Q8Weights(hf)

    def row_parts(self, name, shape):
        return self._weights.row_parts(name, shape)


@torch.inference_mode()
def test_the_engine_verifies_ngram_drafts_in_the_compiled_step(monkeypatch, device):
    """`--spec ngram` on the compiled CPU step: every verify step runs in the C step (the eager
    forward, where it runs, only prefills), drafts are taken, and greedy output is the plain
    run's."""
    if device.type != "cpu":
        pytest.skip("the compiled step serves the CPU only")
    from .test_speculation import off_and_ngram

    artifact = Q8Artifact(tiny_llama(seed=5))
    eager_rows = []
    forward = Runner._eager
    monkeypatch.setattr(Runner, "_eager", lambda self, work, sampled: (
        eager_rows.extend(verify for _, _, verify in work), forward(self, work, sampled))[1])
    outputs, engines = off_and_ngram(artifact, max_concurrency=2)
    assert all(isinstance(e.runner.graphs.decoder, CpuDecoder) for e in engines)
    assert outputs[0] == outputs[1]
    counters = engines[1].speculator.counters
    assert counters.rounds > 0 and counters.accepted > 0
    assert not any(eager_rows)  # no verify row (short prompts run in the C step too)


@torch.inference_mode()
def test_short_prompt_chunks_run_in_the_compiled_step(monkeypatch, device):
    """Prompt chunks of at most `RAGGED_PROMPT_TOKENS` tokens run as rows of the C step at
    consecutive positions (calls of its 16 rows, after the step's decode rows), a longer one
    through the eager forward; every token of the greedy outputs is the all-eager prefill's
    (the same stored weight values, another summation order: the prompt's last logits move
    by the decode step's bound, the 12 tokens after it read the K/V the C step wrote). Three
    rows at once, so chunks share steps with decode rows; no prefix reuse, so each prompt is
    computed whole."""
    if device.type != "cpu":
        pytest.skip("the compiled step serves the CPU only")
    from pathlib import Path

    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine
    from ninfer_engine.step import ragged_rows
    from ninfer_engine.types import GenerationRequest, SamplingParams

    from .mask_helpers import drive, tokens

    artifact = Q8Artifact(tiny_llama(seed=5))
    gen = torch.Generator().manual_seed(3)
    lengths = (5, 16, 23, 32, 47)  # a call, a whole one, two calls, two whole, the eager path
    prompts = [tuple(torch.randint(0, 128, (n,), generator=gen).tolist()) for n in lengths]
    eager_tokens = []
    forward = Runner._eager
    monkeypatch.setattr(Runner, "_eager", lambda self, work, sampled: (
        eager_tokens.extend(len(ids) for _, ids, _ in work), forward(self, work, sampled))[1])
    outputs = []
    for cap in (0, ragged_rows.RAGGED_PROMPT_TOKENS):
        monkeypatch.setattr(ragged_rows, "RAGGED_PROMPT_TOKENS", cap)
        eager_tokens.clear()
        engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=256,
                                     max_concurrency=3, no_prefix_reuse=True), artifact)
        assert isinstance(engine.runner.graphs.decoder, CpuDecoder)
        requests = [GenerationRequest(f"r{i}", p, SamplingParams(temperature=0.0), 12,
                                      ignore_eos=True) for i, p in enumerate(prompts)]
        events = drive(engine, requests)
        engine.stop()
        outputs.append({rid: tokens(e) for rid, e in events.items()})
        if cap:
            assert eager_tokens == [47]  # the one prompt past the cap; nothing else
        else:
            assert sorted(eager_tokens) == sorted(lengths)
    assert outputs[0] == outputs[1]
    assert all(len(out) == 12 for out in outputs[1].values())


def test_a_step_whose_short_prompts_sample_nothing_runs_in_the_compiled_step(device):
    """A request with `max_tokens` 0 (the prompt computed, nothing sampled) whose chunk goes
    through the C step alone: the step has no sampled row. It ends with no tokens; the engine
    stays ready and serves the next request (before, `ragged_forward` stacked an empty list
    and the engine failed for every request, found by fuzzing the HTTP server)."""
    if device.type != "cpu":
        pytest.skip("the compiled step serves the CPU only")
    from pathlib import Path

    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine
    from ninfer_engine.types import EngineState, GenerationRequest, SamplingParams

    from .mask_helpers import drive, tokens

    engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=256,
                                 no_prefix_reuse=True), Q8Artifact(tiny_llama(seed=5)))
    assert isinstance(engine.runner.graphs.decoder, CpuDecoder)
    greedy = SamplingParams(temperature=0.0)
    nothing = drive(engine, [GenerationRequest("r0", tuple(range(3, 13)), greedy, 0)])["r0"]
    assert tokens(nothing) == [] and nothing[-1].finish == "length"
    assert engine.state is EngineState.READY
    after = drive(engine, [GenerationRequest("r1", tuple(range(5, 17)), greedy, 4,
                                             ignore_eos=True)])["r1"]
    engine.stop()
    assert len(tokens(after)) == 4
