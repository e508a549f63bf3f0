"""Offloaded experts on CUDA (run on the device: `pytest -m gpu tests/experts`): page-locked
host store, side-stream slot copies, the uncaptured kernel step."""
from __future__ import annotations

import asyncio

import pytest
import torch

from ninfer_engine.artifact.synth import write_synthetic
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.models.packed import FP8_ROW
from ninfer_engine.types import GenerationRequest, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
# one tiny-moe expert: gate|up [48, 64] + down [64, 24]
FP32_MIB = (48 * 64 + 64 * 24) * 4 / 2**20
FP8_MIB = (48 * 64 + 48 * 2 + 64 * 24 + 64 * 2) / 2**20  # e4m3 codes + bf16 row scales


def serve(path, tokens: int = 24, **flags):
    engine = Engine(EngineConfig(artifact=path, max_context=1024, **flags))
    engine.start()
    request = GenerationRequest("r", tuple(range(5, 105)), SamplingParams(temperature=0.0),
                                tokens, ignore_eos=True)

    async def collect():
        return [e async for e in engine.submit(request)]

    try:
        events = asyncio.run(collect())
        return [t for e in events for t in e.token_ids], engine.snapshot(), engine
    finally:
        engine.stop()


def test_fp32_copy_path_serves_the_all_resident_tokens(tmp_path):
    """`--cuda-dtype fp32` runs the eager forward (exact torch): copied misses give the same
    greedy tokens as every expert resident."""
    path = write_synthetic("tiny-moe", tmp_path / "moe.ninfer")
    want, _, _ = serve(path, cuda_dtype="fp32")
    got, snap, _ = serve(path, cuda_dtype="fp32", expert_vram_mib=2 * 4 * FP32_MIB,
                         expert_miss="copy")
    assert got == want
    assert snap.experts.misses > 0 and snap.experts.bytes_copied > 0
    assert snap.host.pinned_experts == 8 * 4 * round(FP32_MIB * 2**20)


@pytest.mark.parametrize("miss", ["copy", "cpu", "auto"])
def test_fp8_experts_decode_through_the_slots(tmp_path, miss):
    """fp8-row experts, bf16: the host store keeps e4m3 codes, the kernel step reads the slots
    (uncaptured: no graphs), misses copied or computed on the CPU; the request completes."""
    path = write_synthetic("tiny-moe", tmp_path / "moe8.ninfer", recipe="fp8-row")
    tokens, snap, engine = serve(path, expert_vram_mib=2 * 4 * FP8_MIB, expert_miss=miss)
    assert len(tokens) == 24
    assert engine.runner.graphs is not None and not engine.runner.graphs.capture
    tiers = engine.model.expert_tiers
    assert {t.slot_gu.fmt for t in tiers.layers.values()} == {FP8_ROW}
    assert tiers.host.buffer.is_pinned()
    x = snap.experts
    assert x.misses > 0
    if miss == "copy":  # two slots hold one token's top-2: a miss always finds one
        assert x.cpu_share == 0 and x.bytes_copied > 0
    if miss == "cpu":
        assert x.cpu_share > 0 and x.bytes_copied == 0


def test_elastic_lending_is_taken_back_on_cuda(tmp_path):
    """`--elastic` on CUDA: the capacity not grown into is lent as slots (reallocated stacks),
    KV growth takes it back (stacks shrunk, the CUDA cache emptied for the KV to grow into),
    and the fp32 tokens equal the all-resident engine's."""
    path = write_synthetic("tiny-moe", tmp_path / "moe.ninfer")
    want, _, _ = serve(path, tokens=120, cuda_dtype="fp32")
    got, snap, _ = serve(path, tokens=120, cuda_dtype="fp32", expert_vram_mib=2 * 4 * FP32_MIB,
                         expert_miss="copy", elastic=True, kv_grow=64, kv_lease_window=16)
    assert got == want
    assert snap.kv.total >= 4 and snap.kv.lent == snap.experts.lent_pages < 16 - 1
