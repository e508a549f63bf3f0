"""The startup warm-up (`step.warm_up`) runs every kind of prompt step once, through the engine's
own path, and leaves nothing running."""

from pathlib import Path

import pytest
import torch

from ninfer_engine.artifact.synth import build_synthetic
from ninfer_engine.benchmark import engine_step
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.step.decode_graphs import PROMPT_ROWS
from ninfer_engine.step.warm_up import warm_up
from ninfer_engine.types import GenerationRequest, SamplingParams
from tests.benchmark.tiny import tiny_config, tiny_source
from tests.engine.helpers import default_resources, fresh_process

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton compiles on CUDA only")


def test_warm_up_runs_each_prompt_step_kind(monkeypatch):
    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    config = tiny_config(False)
    source = tiny_source(config)
    model = Qwen35Model(config, FusedParams(config, lambda n, s: source(n, s).float()))
    # the CUDA engine's chunk: its steps of thousands of rows, not a toy chunk's small ones
    engine = engine_step.bench_engine(model, "tiny-dense", config, 4, 8192, prefill_chunk=4096)
    kinds = []
    forward = engine.runner.forward

    def seen(batch):
        kinds.append(dict(prompts=len(batch.chunks), decode=len(batch.decode),
                          over_earlier=any(c.seq.cached > 0 for c in batch.chunks),
                          tokens=sum(c.tokens for c in batch.chunks)))
        return forward(batch)

    engine.runner.forward = seen
    # the Qwen3.5 presets' kind: sampled with top-k, presence penalty
    engine.sampling_defaults = SamplingParams(temperature=0.7, top_k=20, top_p=0.8,
                                              presence_penalty=1.5)
    added = []
    add = engine.add
    engine.add = lambda request, emit: added.append(request.sampling) or add(request, emit)
    warm_up(engine, 4096, 8192)
    assert any(k["prompts"] >= 2 for k in kinds)  # several prompts in one step
    assert any(k["over_earlier"] for k in kinds)  # a chunk over the prompt's first chunk
    # a chunk beside decode rows, of more rows than a prompt graph's: an eager step of a few
    assert any(k["prompts"] and k["decode"] and k["tokens"] > max(PROMPT_ROWS) for k in kinds)
    # as served requests sample: the preset's penalties made greedy, the preset's sampling
    preset = engine.sampling_defaults
    assert any(p.temperature == 0 and (p.presence_penalty, p.frequency_penalty) == (
        preset.presence_penalty, preset.frequency_penalty) for p in added)
    assert any(p.temperature > 0 and p.top_k == preset.top_k and p.seed is not None
               for p in added)
    assert not engine.scheduler.running and not list(engine.scheduler.queued())


def _spec_engine(monkeypatch, concurrency: int):
    """The tiny dense model's engine under `--spec` (3 drafts), 256-token prompt chunks."""
    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    config = tiny_config(False)
    source = tiny_source(config)
    model = Qwen35Model(config, FusedParams(config, lambda n, s: source(n, s).float()))
    return engine_step.bench_engine(model, "tiny-dense", config, concurrency, 2048,
                                    draft_tokens=3, prefill_chunk=256)


def test_under_spec_the_warm_up_serves_its_short_requests_drafted_then_plain(monkeypatch):
    """With a speculator the short requests run again under each forced policy, decoding past
    the MTP head's spill, and the served policy is back afterwards."""
    from ninfer_engine.step.mtp_drafter import SPILL
    from ninfer_engine.step.spec_policy import AlwaysSpeculate, NeverSpeculate, SpecPolicy

    engine = _spec_engine(monkeypatch, 4)
    spec = engine.speculator
    served = spec.policy
    longest = {}  # policy type -> the longest output a decode step saw under it
    step = engine.step

    def seen():
        kind = type(spec.policy)
        outputs = [len(s.output) for s in engine.scheduler.running]
        longest[kind] = max([longest.get(kind, 0), *outputs])
        return step()
    engine.step = seen
    warm_up(engine, 256, 2048)
    assert spec.policy is served and type(served) is SpecPolicy
    assert longest[AlwaysSpeculate] > SPILL and longest[NeverSpeculate] > SPILL
    assert not engine.scheduler.running and not list(engine.scheduler.queued())


@pytest.mark.parametrize("stalled", [False, True])
def test_at_concurrency_one_every_warm_up_request_ends_before_serving(monkeypatch, caplog,
                                                                     stalled):
    """One row at a time (`--max-concurrency 1`, every B = 1 benchmark) under `--spec`: the
    requests run one after another, past the 80 steps the loop once had, and each ends with
    its full output; nothing is left running or queued for the first served steps. A warm-up
    that cannot finish (steps that do nothing) stops at its bound, says so, and cancels what
    is left rather than running on."""
    engine = _spec_engine(monkeypatch, 1)
    seqs, steps = [], [0]
    add, step = engine.add, engine.step

    def added(request, emit):
        seqs.append(add(request, emit))
        return seqs[-1]

    def counted():
        steps[0] += 1
        return True if stalled else step()
    engine.add, engine.step = added, counted
    warm_up(engine, 256, 2048)
    if stalled:
        assert "unfinished after" in caplog.text and all(s.cancelled for s in seqs)
        return
    assert steps[0] > 80 and len(seqs) == 3 * 5 + 1
    assert all(s.finish_reason == "length" and len(s.output) == s.request.max_tokens
               for s in seqs)
    assert not engine.scheduler.running and not list(engine.scheduler.queued())


def test_the_sampling_warm_up_takes_every_top_k_count_and_both_penalty_variants(monkeypatch):
    """Whatever the preset: penalties with and without a pick in flight, and the top-k path at
    every candidate count, over logits in the model's dtype and in fp32."""
    from types import SimpleNamespace

    from ninfer_engine.step import warm_up as module
    from ninfer_engine.step.sampling_paths import TOPK_CAP

    seen = []
    pick = module.pick_rows

    def picked(logits, samplers, pending=None):
        seen.append((logits.dtype, max(s.params.top_k for s in samplers), pending is not None,
                     any(s.params.penalized and s.counts for s in samplers)))
        return pick(logits, samplers, pending)
    monkeypatch.setattr(module, "pick_rows", picked)
    module.warm_up_sampling(SimpleNamespace(vocab_size=300, dtype=torch.bfloat16,
                                            device=torch.device("cpu")))
    counts = {1 << i for i in range(TOPK_CAP.bit_length())}
    for dtype in (torch.bfloat16, torch.float32):
        assert {k for d, k, _, _ in seen if d == dtype} == counts
        assert {p for d, _, p, penalized in seen if d == dtype and penalized} == {True, False}


def _mtp_engine(artifact, **config) -> Engine:
    """A `--spec mtp --draft-tokens 3` engine of 1,024-token rows over `artifact` (a tiny
    hybrid model with a random MTP head), its other settings `config`."""
    return Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=1024, spec="mtp",
                               draft_tokens=3, **config), artifact)


def test_the_warm_up_runs_an_eager_step_of_several_one_token_rows():
    """Two 2-token prompts together: a hybrid prompt's first chunk ends a token before its end
    (`SequenceMemory.chunk_tokens`), so their first tokens are one-token rows of one eager step
    (the several-row GEMV and decode attention a served burst compiled in traffic)."""
    from .test_mtp_speculation import MtpArtifact

    engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=1024, max_concurrency=4,
                                 prefill_chunk=256, cuda_dtype="fp32"), MtpArtifact("qwen3_5_moe"))
    firsts = []  # the one-token first chunks of each step
    forward = engine.runner.forward

    def rows(batch):
        firsts.append(sum(c.tokens == 1 and c.seq.cached == 0 for c in batch.chunks))
        return forward(batch)
    engine.runner.forward = rows
    assert warm_up(engine, 256, 1024) is not None
    assert max(firsts) >= 2, firsts


def test_a_spec_mtp_engine_serves_after_its_warm_up_as_a_fresh_one():
    """The MTP head's rows, the policy and the counters after the warm-up's forced-policy
    rounds leave nothing behind: the same greedy requests come out of a warmed engine as out
    of a fresh one, and the counters start from zero."""
    from .test_mtp_speculation import MtpArtifact
    from .test_speculation import _prompts, _run

    artifact, outputs = MtpArtifact("qwen3_5_moe"), []
    for warmed in (True, False):
        engine = _mtp_engine(artifact, max_concurrency=4, prefill_chunk=64, cuda_dtype="fp32")
        if warmed:  # as a CUDA engine's load does (`Engine.__init__`)
            assert warm_up(engine, 64, 1024) is not None
            engine.memory.forget_prefixes()
            engine.speculator.reset()
            assert engine.speculator.counters.rounds == 0
        engine.start()
        try:
            outputs.append(_run(engine, _prompts(120), 24))
        finally:
            engine.stop()
    assert outputs[0] == outputs[1]


def _compiles_while(run) -> list[str]:
    """The Triton kernels compiled while `run()` ran."""
    from triton import knobs

    compiled = []
    before = knobs.runtime.jit_cache_hook

    def seen(**kw):
        compiled.append(kw["fn"].name)
        return before(**kw) if before else False
    knobs.runtime.jit_cache_hook = seen
    try:
        run()
    finally:
        knobs.runtime.jit_cache_hook = before
    return compiled


def _compiles_then_stop(engine, run) -> list[str]:
    """`_compiles_while(run)`, the engine stopped after it."""
    try:
        return _compiles_while(run)
    finally:
        engine.stop()


def _run_to_length(engine, requests: list[GenerationRequest], steps: int) -> None:
    """Add `requests` and step until each has ended (at most `steps` steps): at its length."""
    seqs = [engine.add(request, lambda event: None) for request in requests]
    for _ in range(steps):  # bounded
        if not engine.step() or all(s.finish_reason for s in seqs):
            break
    assert all(s.finish_reason == "length" for s in seqs)


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_warm_up_a_long_context_decodes_without_compiling():
    """One prompt past 132 pages (the split count's cap at batch 1): its decode attention
    splits 132 ways. The merge kernel's block of splits was a power of two of that count, so
    a context longer than the warm-up's prompts compiled a variant in traffic (856 ms on the
    H200's host-tier benchmark, bench/host_tier_ttft.py); it now walks any count in blocks."""
    config, source = build_synthetic("tiny-moe", "cuda", torch.bfloat16, 4)
    model = Qwen35Model(config, FusedParams(config, source))
    engine = engine_step.bench_engine(model, "tiny-moe", config, 1, 10240, prefill_chunk=2048)
    prompt = engine_step.random_prompts(1, 9000, config["vocab_size"], seed=3)[0]

    def long_request():  # bounded: 5 prompt chunks and 4 tokens
        _run_to_length(engine, [GenerationRequest("long", prompt, SamplingParams(temperature=0.0),
                                                  max_tokens=4, ignore_eos=True)], 16)
    assert _compiles_then_stop(engine, long_request) == []


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_warm_up_prompts_arriving_together_compile_nothing():
    """Bursts of 1..8 prompts (served sampling, prefix cache on) after the start-up warm-up:
    no Triton kernel compiles. A variant per burst size (an integer argument or a metadata
    slice's alignment that changes with the row count) stalled the H200's first burst of 8 by
    1.2 s (bench/prompt_burst.py)."""
    config, source = build_synthetic("tiny-moe", "cuda", torch.bfloat16, 4)
    model = Qwen35Model(config, FusedParams(config, source))
    engine = engine_step.bench_engine(model, "tiny-moe", config, 8, 2048, prefix_reuse=True)

    def bursts():
        sampling = engine_step.served_sampling(engine)
        for n in range(1, 9):
            prompts = engine_step.random_prompts(n, 100 + 7 * n, config["vocab_size"], seed=n)
            _run_to_length(engine, [GenerationRequest(f"b{n}-{i}", p, sampling, max_tokens=4,
                                                      ignore_eos=True)
                                    for i, p in enumerate(prompts)], 64)
    assert _compiles_then_stop(engine, bursts) == []


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_warm_up_long_prompts_arriving_together_compile_nothing():
    """Eight prompts of 300 tokens in one step give the paged prefill kernel at least 5 query
    tiles × 7 rows × 4 heads = 140 programs, an SM's worth each (`paged_prefill.SMS` = 132):
    their pages are not split, a launch the warm-up's short steps never took (it compiled in
    the H200's first burst of eight 1K prompts, 0.76 s) until `warm_up_paged_attention` ran it."""
    config, source = build_synthetic("tiny-moe", "cuda", torch.bfloat16, 4)
    model = Qwen35Model(config, FusedParams(config, source))
    engine = engine_step.bench_engine(model, "tiny-moe", config, 8, 2048)
    prompts = engine_step.random_prompts(8, 300, config["vocab_size"], seed=8)

    def burst():
        _run_to_length(engine, [GenerationRequest(f"long-{i}", p, SamplingParams(temperature=0.0),
                                                  max_tokens=2, ignore_eos=True)
                                for i, p in enumerate(prompts)], 16)
    assert _compiles_then_stop(engine, burst) == []


def _packed_tiny_model(device: str):
    """The tiny MoE hybrid (2 layers: GDN and gated attention) with fp8-row projections."""
    from ninfer_engine.benchmark.footprint import packed_source

    config, source = build_synthetic("tiny-moe", device, torch.bfloat16, 2)
    return Qwen35Model(config, FusedParams(config, packed_source(source, "fp8-row")))


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_kernel_warm_up_every_expert_row_tile_is_compiled():
    """`Qwen35Model.warm_up_kernels` runs the grouped expert kernels at each row tile
    (`moe_grouped.ROW_TILES`): a prompt step of any length then compiles none. On the H200's
    35B-A3B shape the warm-up requests' steps took 16- and 128-row tiles only, and the first
    8x120 burst compiled the 64-row variants in traffic (1.1 s)."""
    from ninfer_engine.kernels.moe_grouped import row_tile
    from ninfer_engine.models.moe import SparseMoE

    model = _packed_tiny_model("cuda")
    config = model.config
    moe = next(b.ffn for b in model.blocks if isinstance(b.ffn, SparseMoE))
    experts, slots = config["num_experts"] + 1, config["num_experts_per_tok"] + 1
    lengths = (40, 100, 500)  # the shared expert is one more slot of one more stacked expert
    assert sorted({row_tile(n * slots, experts) for n in lengths}) == [16, 64, 128]
    assert model.warm_up_kernels()  # the fp8 stacks run the grouped kernels
    gen = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(n, config["hidden_size"], dtype=torch.bfloat16, device="cuda",
                      generator=gen) for n in lengths]
    assert _compiles_while(lambda: [moe(x) for x in xs]) == []


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_warm_up_a_spec_mtp_burst_compiles_nothing():
    """A `--spec mtp` engine under the served timing policy: a burst of 8 prompts (penalized
    greedy and sampled rows) decoding past the MTP head's spill compiles nothing. Before the
    warm-up's forced-policy rounds, the H100's first 8-prompt burst on the 35B-A3B shape
    compiled the penalties with a pending pick and the head's eager launches (0.8-1.35 s)."""
    from ninfer_engine.step.mtp_drafter import SPILL

    from .test_mtp_speculation import MtpArtifact
    from .test_speculation import _run

    engine = _mtp_engine(MtpArtifact("qwen3_5_moe"), max_concurrency=8, cuda_dtype="bf16")
    engine.start()
    gen = torch.Generator().manual_seed(5)
    prompts = [tuple(torch.randint(3, 120, (250 + 13 * i,), generator=gen).tolist())
               for i in range(8)]
    # penalties and top-k, which the tiny artifact's preset lacks: `warm_up_sampling` compiles
    # them whatever the preset
    samplings = (SamplingParams(temperature=0.0, presence_penalty=1.5),
                 SamplingParams(temperature=0.8, top_k=20, seed=1),
                 SamplingParams(temperature=0.8, top_k=50, frequency_penalty=0.5, seed=2))

    def burst():
        for sampling in samplings:
            _run(engine, prompts, SPILL + 24, sampling)
    assert _compiles_then_stop(engine, burst) == []


def test_the_few_row_warm_up_runs_every_packed_projection_shape_at_one_and_two_rows(
        monkeypatch):
    """`warm_up_few_rows` over the mixers' projections: each distinct packed weight (shape,
    encodings, planes' alignment) at one and two rows, dense ones not at all."""
    from ninfer_engine.models.layers import warm_up_few_rows
    from ninfer_engine.models.packed import PackedMatrix

    model = _packed_tiny_model("cpu")
    projections = [p for b in model.blocks for p in getattr(b.mixer, "projections", ())]
    packed = {(p.weight.shape, tuple(b.fmt for b in p.weight.blocks)) for p in projections
              if isinstance(p.weight, PackedMatrix)}
    # fp8-row, among them the GDN's 4-head a and b projections (the shape traffic compiled)
    assert ((4, 64), ("fp8_e4m3fn_row_bf16",)) in packed, packed
    seen = []
    linear = PackedMatrix.linear

    def spy(weight, x, fp8_act=False):
        seen.append(((weight.shape, tuple(b.fmt for b in weight.blocks)), x.shape[0]))
        return linear(weight, x, fp8_act)
    monkeypatch.setattr(PackedMatrix, "linear", spy)
    assert warm_up_few_rows(projections, model.dtype, model.device) >= len(packed)
    assert {(key, rows) for key in packed for rows in (1, 2)} == set(seen)


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_kernel_warm_up_an_eager_step_of_few_rows_compiles_no_projection():
    """After `Qwen35Model.warm_up_kernels`, the mixers' packed projections at 3 and 7 rows (an
    eager step of one-token rows beside verify rows) compile nothing: a `--spec mtp` burst on
    the H100 and the H200 compiled the GDN's `a` and `b` projections' variants in traffic."""
    model = _packed_tiny_model("cuda")
    projections = [p for b in model.blocks for p in getattr(b.mixer, "projections", ())]
    assert model.warm_up_kernels()
    calls = [(p, torch.randn(n, p.weight.shape[1], dtype=torch.bfloat16, device="cuda"))
             for p in projections for n in (3, 7)]
    assert _compiles_while(lambda: [p(x) for p, x in calls]) == []


@CUDA
@fresh_process
@torch.inference_mode()
def test_after_the_warm_up_a_host_accepted_rollback_compiles_nothing():
    """Verify rounds accepted on the host (`--verify-chain off`, oracle drafts, 2.5 tokens a
    round forced) roll rows back through `keep_rows`' kernel: its two variants (conv and SSM
    state) compiled in the H100's first timed rollback, 1-2 ms each (h100-verify-host-71d78f1),
    until the start-up capture launched it once."""
    from ninfer_engine.benchmark.forced_drafts import OracleDrafter
    from ninfer_engine.step.spec_policy import AlwaysSpeculate

    config, source = build_synthetic("tiny-moe", "cuda", torch.bfloat16, 4)
    model = Qwen35Model(config, FusedParams(config, source))
    engine = engine_step.bench_engine(model, "tiny-moe", config, 1, 2048, draft_tokens=3,
                                      verify_chain="off")
    drafter = engine.speculator.drafter = OracleDrafter(2.5, 3, config["vocab_size"])
    engine.speculator.policy = AlwaysSpeculate()
    prompt = engine_step.random_prompts(1, 100, config["vocab_size"], seed=5)[0]

    def rounds():  # bounded: 24 tokens in rounds of 1-4
        with drafter.forced():
            _run_to_length(engine, [GenerationRequest("r", prompt, SamplingParams(temperature=0.0),
                                                      max_tokens=24, ignore_eos=True)], 64)
    assert _compiles_then_stop(engine, rounds) == []
