"""`--kv-capacity auto`: the pool sized from the free device memory (`kv.sizing`), CPU only.

The device's free memory is injected (`memory_plan.free_device_bytes`), so the sizing
arithmetic and its wiring into the engine run without a GPU.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from ninfer_engine import memory_plan
from ninfer_engine.cli.capabilities import FeatureUnavailable, Machine, check_features
from ninfer_engine.config import PAGE_TOKENS, EngineConfig
from ninfer_engine.engine import Engine, EngineLoadError
from ninfer_engine.memory_plan import recurrent_state_bytes
from ninfer_engine.models.dflash import DFlashContext
from ninfer_engine.cli.flags import parse_args
from ninfer_engine.kv import (KV_DTYPES, ElasticPagePool, KvStorage, PagePool, codecs_for,
                              kv_page_layout)
from ninfer_engine.kv.sizing import (ACTIVATION_SAFETY, ALLOC_SLACK, GIB, MIB, KvSizingError,
                                     auto_kv_tokens, elastic_capacity_pages,
                                     prefill_activation_bytes)

from .dflash_helpers import DFlashArtifact
from .helpers import FakeArtifact, tiny_llama
from .hybrid_helpers import HybridArtifact
from .test_mtp_speculation import MtpArtifact

BPT = 1024  # bytes per token in the pure-function tests: 64 KiB pages


# --- the pure sizing function ---------------------------------------------------------------

def test_fits_the_budget_in_whole_pages():
    free = 10 * GIB
    tokens = auto_kv_tokens(free, GIB, GIB, BPT, PAGE_TOKENS, 8192)
    assert tokens == 8 * GIB // BPT and tokens % PAGE_TOKENS == 0
    # a budget one byte short of a page, or a page plus change, rounds down to whole pages
    page = BPT * PAGE_TOKENS
    assert auto_kv_tokens(2 * GIB + 7 * page - 1, GIB, GIB, BPT, PAGE_TOKENS, 64) == 6 * 64
    assert auto_kv_tokens(2 * GIB + 7 * page + 999, GIB, GIB, BPT, PAGE_TOKENS, 64) == 7 * 64


def test_headroom_and_reserve_are_subtracted():
    free, page = 4 * GIB, BPT * PAGE_TOKENS
    base = auto_kv_tokens(free, 0, 0, BPT, PAGE_TOKENS, 64)
    assert base == free // BPT
    with_headroom = auto_kv_tokens(free, 512 * MIB, 0, BPT, PAGE_TOKENS, 64)
    assert with_headroom == (free - 512 * MIB) // page * PAGE_TOKENS
    both = auto_kv_tokens(free, 512 * MIB, 100 * MIB + 1, BPT, PAGE_TOKENS, 64)
    assert both == (free - 612 * MIB - 1) // page * PAGE_TOKENS < with_headroom


def test_exactly_max_context_fits():
    page = BPT * PAGE_TOKENS
    assert auto_kv_tokens(GIB + 10 * page, GIB, 0, BPT, PAGE_TOKENS, 600) == 640


def test_below_max_context_fails_naming_the_flags_and_numbers():
    page = BPT * PAGE_TOKENS
    with pytest.raises(KvSizingError) as err:
        auto_kv_tokens(GIB + 9 * page, GIB, 0, BPT, PAGE_TOKENS, 600)
    message = str(err.value)
    assert "\n" not in message
    for part in ("--kv-capacity auto", "--vram-headroom-mib 1024", "--max-context 600",
                 "leaves 576 KV tokens", f"{BPT} bytes each", "1.00 GiB free",
                 "(at most 1023 fits)"):
        assert part in message, (part, message)


def test_nothing_left_after_headroom_fails_too():
    with pytest.raises(KvSizingError, match="leaves 0 KV tokens"):
        auto_kv_tokens(GIB, 2 * GIB, 0, BPT, PAGE_TOKENS, 64)


def _elastic_peak(capacity: int, step: int) -> int:
    """Most pages held at once while the real `ElasticPagePool` grows to `capacity` a page at a
    time: old + new tensors during each growth (`KvStorage._grow`)."""
    pool = ElasticPagePool(capacity, step)
    peak = [pool.total]
    pool.on_grow(lambda new_total: peak.append(pool.total + new_total))
    for tokens in range(1, capacity * PAGE_TOKENS + 1, PAGE_TOKENS):
        assert pool.lease("owner", tokens)
    assert pool.total == capacity
    return max(peak)


@pytest.mark.parametrize("budget, step", [(1, 4), (3, 4), (4, 4), (5, 4), (9, 4), (20, 3),
                                          (300, 128), (1000, 128), (37, 1)])
def test_elastic_capacity_is_the_largest_whose_growth_fits(budget, step):
    cap = elastic_capacity_pages(budget, step)
    assert 0 < cap <= budget
    assert _elastic_peak(cap, step) <= budget
    assert _elastic_peak(cap + 1, step) > budget


def test_elastic_sizing_and_its_error():
    page = BPT * PAGE_TOKENS
    # 300 pages of budget, 128-page steps: 172 pages are reachable (128 + 172 = 300 at the peak)
    assert auto_kv_tokens(300 * page, 0, 0, BPT, PAGE_TOKENS, 64, grow_tokens=8192) == 172 * 64
    with pytest.raises(KvSizingError, match="under --elastic growth"):
        auto_kv_tokens(300 * page, 0, 0, BPT, PAGE_TOKENS, 200 * 64, grow_tokens=8192)


def test_prefill_activation_estimate():
    llama = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336}
    per_token = 2 * (4 * 4096 + 3 * 32 * 128 + 2 * 8 * 128 + 3 * 14336)
    assert prefill_activation_bytes(llama, 4096, 2) == 4096 * ACTIVATION_SAFETY * per_token
    assert prefill_activation_bytes(llama, 1024, 2) * 4 == prefill_activation_bytes(llama, 4096, 2)
    moe = {**llama, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
           "shared_expert_intermediate_size": 0}
    routed = 2 * 8 * (3 * 768 + 4 * 4096) + 4 * 128
    assert prefill_activation_bytes(moe, 1, 2) == ACTIVATION_SAFETY * (
        2 * (4 * 4096 + 3 * 32 * 128 + 2 * 8 * 128) + routed)
    hybrid = {**llama, "layer_types": ["linear_attention", "full_attention"],
              "linear_num_key_heads": 16, "linear_key_head_dim": 128,
              "linear_num_value_heads": 32, "linear_value_head_dim": 128}
    assert prefill_activation_bytes(hybrid, 1, 2) > prefill_activation_bytes(llama, 1, 2)


# --- bytes per token against the real storage ------------------------------------------------

@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("activation", [torch.bfloat16, torch.float32])
def test_page_layout_matches_an_allocated_storage(kv_dtype, activation):
    layers, heads, dim, pages = 3, 2, 32, 5
    codecs = codecs_for(kv_dtype, activation)
    storage = KvStorage(PagePool(pages), layers, heads, dim, codecs, activation, "cpu")
    page_bytes, tensors = kv_page_layout(layers, heads, dim, codecs, PAGE_TOKENS)
    assert page_bytes == storage.page_bytes and storage.nbytes == pages * page_bytes
    assert tensors == sum(len(layer) for layer in (*storage.k, *storage.v))


def test_page_layout_counts_the_drafter_rows_a_slot_keeps():
    layers, heads, dim, pages, width = 2, 2, 32, 3, 48
    codecs = codecs_for("int8", torch.bfloat16)
    storage = KvStorage(PagePool(pages), layers, heads, dim, codecs, torch.bfloat16, "cpu",
                        row_width=width)
    page_bytes, tensors = kv_page_layout(layers, heads, dim, codecs, PAGE_TOKENS, width * 2)
    plain, plain_tensors = kv_page_layout(layers, heads, dim, codecs, PAGE_TOKENS)
    assert page_bytes == storage.page_bytes == plain + PAGE_TOKENS * width * 2
    assert tensors == plain_tensors + 1 and storage.nbytes == pages * page_bytes


def test_quantized_dtypes_store_fewer_bytes_than_bf16_including_scales():
    sizes = {d: kv_page_layout(4, 2, 128, codecs_for(d, torch.bfloat16), PAGE_TOKENS)[0]
             for d in KV_DTYPES}
    per_value = {d: sizes[d] / (4 * 2 * 128 * 2 * PAGE_TOKENS) for d in KV_DTYPES}
    assert per_value["bf16"] == 2
    assert per_value["int8"] == 1 + 2 / 32  # fp16 scale per 32 values
    assert per_value["fp8"] == 1 + 4 / 128  # fp32 scale per head vector
    assert per_value["nvfp4"] == 0.5 + 1 / 16 + 4 / 128
    assert per_value["k8v4"] == ((1 + 2 / 32) + (0.5 + 2 / 16)) / 2


# --- the capability gate ---------------------------------------------------------------------

def _parse(*argv: str):
    return parse_args(["m.ninfer", *argv], environ={})


@pytest.mark.parametrize("argv", [("--kv-capacity", "auto"),
                                  ("--kv-capacity", "auto", "--vram-headroom-mib", "2048")])
def test_gate_refuses_auto_without_cuda_and_passes_with_it(argv):
    parsed = _parse(*argv)
    assert parsed.config.kv_capacity_auto and parsed.config.kv_capacity is None
    with pytest.raises(FeatureUnavailable, match="automatic KV sizing needs a CUDA device"):
        check_features(parsed.config, parsed.explicit, Machine(cuda_devices=0))
    check_features(parsed.config, parsed.explicit, Machine(cuda_devices=1))


# --- wiring into the engine ------------------------------------------------------------------

def _reserve(artifact, config: EngineConfig, device: torch.device, page_tensors: int,
             states: int = 0) -> int:
    """What the engine keeps free beside the pool for a model without fp8 experts."""
    itemsize = _activation_dtype(device, config).itemsize
    activations = prefill_activation_bytes(artifact.config("text"), config.prefill_chunk,
                                           itemsize)
    return activations + states + page_tensors * ALLOC_SLACK


def _activation_dtype(device: torch.device, config: EngineConfig) -> torch.dtype:
    if device.type == "cpu" or config.cuda_dtype == "fp32":
        return torch.float32
    return torch.bfloat16


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_engine_sizes_the_pool_from_free_memory(kv_dtype, device, monkeypatch, caplog):
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    config = EngineConfig(artifact=Path("t"), kv_capacity_auto=True, vram_headroom_mib=3,
                          max_context=256, prefill_chunk=128, kv_dtype=kv_dtype,
                          cuda_dtype="fp32")
    cfg = artifact.config("text")
    heads = cfg["num_key_value_heads"]
    dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    dtype = _activation_dtype(device, config)
    page_bytes, tensors = kv_page_layout(cfg["num_hidden_layers"], heads, dim,
                                         codecs_for(kv_dtype, dtype), PAGE_TOKENS)
    free = 3 * MIB + _reserve(artifact, config, device, tensors) + 11 * page_bytes + page_bytes // 2
    monkeypatch.setattr(memory_plan, "free_device_bytes", lambda device: free)
    with caplog.at_level(logging.INFO, logger="ninfer.engine"):
        engine = Engine(config, artifact)
    assert engine.memory.storage.page_bytes == page_bytes
    assert engine.memory.allocator.total == 11 and engine.snapshot().kv.total == 11
    assert engine.config.kv_capacity == 11 * PAGE_TOKENS and engine.config.kv_capacity_auto
    assert config.kv_capacity is None  # frozen: the engine holds a replaced copy
    assert "--kv-capacity auto: 704 tokens (11 pages" in caplog.text


def test_engine_fails_startup_below_max_context(device, monkeypatch):
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    config = EngineConfig(artifact=Path("t.ninfer"), kv_capacity_auto=True, max_context=1024,
                          prefill_chunk=128, cuda_dtype="fp32")
    cfg = artifact.config("text")
    dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    page_bytes, tensors = kv_page_layout(
        cfg["num_hidden_layers"], cfg["num_key_value_heads"], dim,
        codecs_for("bf16", _activation_dtype(device, config)), PAGE_TOKENS)
    free = GIB + _reserve(artifact, config, device, tensors) + 15 * page_bytes  # 16 pages needed
    monkeypatch.setattr(memory_plan, "free_device_bytes", lambda device: free)
    with pytest.raises(EngineLoadError) as err:
        Engine(config, artifact)
    message = str(err.value)
    assert "\n" not in message and "t.ninfer" in message
    assert "--kv-capacity auto" in message and "--max-context 1024" in message
    assert "leaves 960 KV tokens" in message and "--vram-headroom-mib 1024" in message


def test_engine_reserves_the_recurrent_state_slots(device, monkeypatch):
    artifact = HybridArtifact("qwen3_5")
    config = EngineConfig(artifact=Path("t"), kv_capacity_auto=True, vram_headroom_mib=0,
                          max_context=128, prefill_chunk=64, max_concurrency=2,
                          device_state_slots=3, cuda_dtype="fp32")
    probe = Engine(EngineConfig(artifact=Path("t"), max_context=128, prefill_chunk=64,
                                cuda_dtype="fp32"), artifact)
    state = recurrent_state_bytes(probe.model)
    assert state > 0
    layers, heads, dim = probe.model.kv_layout()
    page_bytes, tensors = kv_page_layout(layers, heads, dim,
                                         codecs_for("bf16", probe.model.dtype), PAGE_TOKENS)
    states = state * (2 + 3)  # running, checkpoints
    free = _reserve(artifact, config, device, tensors, states) + 5 * page_bytes
    monkeypatch.setattr(memory_plan, "free_device_bytes", lambda device: free)
    assert Engine(config, artifact).memory.allocator.total == 5
    no_reuse = EngineConfig(**{**config.__dict__, "no_prefix_reuse": True})
    # without prefix reuse the 3 checkpoint slots are not reserved: more pages
    assert Engine(no_reuse, artifact).memory.allocator.total == 5 + 3 * state // page_bytes


def _grown_dflash(drafter, device) -> tuple[int, int]:
    """A DFlash context grown by a prompt's chunks to 128 positions: (positions, bytes held)."""
    ctx, dflash = DFlashContext(drafter.model, 0), drafter.model
    for _ in range(128 // 16):
        dflash.extend(ctx, torch.randn(16, len(dflash.config.taps) * dflash.config.hidden,
                                       device=device))
    return ctx.end, sum(t.nbytes for kv in ctx.kv for t in (kv.k, kv.v))


@pytest.mark.parametrize("spec, artifact, grown", [
    ("dflash", lambda: DFlashArtifact("qwen3_5"), _grown_dflash),
    ("mtp", lambda: MtpArtifact("qwen3_5"), None)])
def test_engine_reserves_the_drafters_contexts_and_counts_its_rows(device, monkeypatch, spec,
                                                                    artifact, grown):
    """`--spec dflash` and `--spec mtp` with prefix reuse: each KV slot keeps a drafter row
    (in the page's bytes), and --max-concurrency drafter contexts at --max-context are kept
    free, a context grown to --max-context holding no more than that (DFlash's); the MTP
    layer's K/V are one more layer of the pool (in the page's bytes), no context apart."""
    artifact = artifact()
    settings = dict(artifact=Path("t"), max_context=128, prefill_chunk=64, max_concurrency=2,
                    device_state_slots=3, cuda_dtype="fp32", spec=spec, draft_tokens=3)
    probe = Engine(EngineConfig(**settings), artifact)
    model, drafter = probe.model, probe.speculator.drafter
    layers, heads, dim = model.kv_layout()
    layers += getattr(drafter, "kv_layers", 0)
    assert layers == len(probe.memory.storage.k) == model.kv_layout()[0] + (spec == "mtp")
    page_bytes, tensors = kv_page_layout(layers, heads, dim, codecs_for("bf16", model.dtype),
                                         PAGE_TOKENS, drafter.page_rows * model.dtype.itemsize)
    assert drafter.page_rows and probe.memory.storage.page_bytes == page_bytes
    states = recurrent_state_bytes(model) * (2 + 3 + 2 * 3)  # running, checkpoints, verify
    contexts = 2 * drafter.context_bytes(128) if grown is not None else 0
    assert grown is None or contexts > 2 * page_bytes  # what leaving them out would cost
    config = EngineConfig(**settings, kv_capacity_auto=True, vram_headroom_mib=0)
    free = _reserve(artifact, config, device, tensors, states + contexts) + 5 * page_bytes
    monkeypatch.setattr(memory_plan, "free_device_bytes", lambda device: free)
    assert Engine(config, artifact).memory.allocator.total == 5
    if grown is not None:
        positions, held = grown(drafter, model.device)
        assert positions == 128 and held <= drafter.context_bytes(128)


def test_engine_on_a_machine_without_cuda_says_so(device):
    if device.type != "cpu":
        pytest.skip("the refusal is for a machine without a CUDA device")
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    config = EngineConfig(artifact=Path("t"), kv_capacity_auto=True)
    with pytest.raises(EngineLoadError, match="needs a CUDA device"):
        Engine(config, artifact)


def test_fixed_capacity_is_unchanged(device):
    artifact = FakeArtifact(tiny_llama(seed=4, vocab_size=259))
    engine = Engine(EngineConfig(artifact=Path("t"), kv_capacity=500), artifact)
    assert engine.memory.allocator.total == 8 and engine.config.kv_capacity == 500


def test_a_hybrid_without_attention_layers_loads(monkeypatch):
    """A hybrid truncated to its GDN layers (`--layers 2` of a synthetic shape) stores no K/V:
    its pages are 0 bytes, and sizing the host tier divided by that (ZeroDivisionError)."""
    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.benchmark import engine_step
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from .helpers import default_resources

    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    config, source = build_synthetic("tiny-moe", "cpu", torch.float32, 2)
    model = Qwen35Model(config, FusedParams(config, source))
    assert model.attention_layers == []
    engine = engine_step.bench_engine(model, "tiny-moe", config, 2, 256)
    run = engine_step.run_requests(engine, engine_step.random_prompts(2, 40, 1000), 3)
    assert engine.memory.storage.page_bytes == 0 and len(run.first_token_s) == 2
