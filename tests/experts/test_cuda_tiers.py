"""Offloaded experts on CUDA (run on the device: `NINFER_TEST_DEVICE=cuda pytest -m gpu
tests/experts`): page-locked host store, side-stream slot copies, the uncaptured kernel step
(misses copied or computed on the CPU) and the captured one (misses read in place)."""
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


def serve(path, tokens: int = 24, before_start=None, **flags):
    engine = Engine(EngineConfig(artifact=path, max_context=1024, **flags))
    if before_start is not None:
        before_start(engine)
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
    """fp8-row experts, bf16: the host store keeps e4m3 codes, the kernel step reads the slots,
    misses copied or computed on the CPU (uncaptured: a host sync a layer), or under auto read
    in place (captured); the request completes."""
    path = write_synthetic("tiny-moe", tmp_path / "moe8.ninfer", recipe="fp8-row")
    tokens, snap, engine = serve(path, expert_vram_mib=2 * 4 * FP8_MIB, expert_miss=miss)
    assert len(tokens) == 24
    assert engine.runner.graphs is not None
    assert engine.runner.graphs.capture == (miss == "auto")
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
    assert snap.kv.total == 16 and snap.kv.lent == snap.experts.lent_pages <= 16 - 4


def test_remapped_kernels_read_page_locked_host_experts():
    """Unified addressing: the expert kernels read the experts not in a slot straight from
    page-locked host memory (`kernels.moe_fused.Remap`), also inside a CUDA graph, and give
    the kernels' output over every expert stacked on the device, bit for bit (fp8-row)."""
    from ninfer_engine.kernels.moe_down import moe_down_combine_triton
    from ninfer_engine.kernels.moe_fused import Remap, moe_gate_up_silu_triton
    torch.manual_seed(0)
    E, I, H, k = 16, 512, 2048, 4
    host_gu = torch.randn(E, 2 * I, H).to(torch.float8_e4m3fn).pin_memory()
    host_dn = torch.randn(E, H, I).to(torch.float8_e4m3fn).pin_memory()
    host_gs = torch.rand(E, 2 * I).to(torch.bfloat16).pin_memory()
    host_ds = torch.rand(E, H).to(torch.bfloat16).pin_memory()
    held = [9, 2, 5]
    slots = [t[held].cuda() for t in (host_gu, host_dn, host_gs, host_ds)]
    stacked = [t.cuda() for t in (host_gu, host_dn, host_gs, host_ds)]
    table = torch.tensor([held.index(e) if e in held else -1 - e for e in range(E)]).cuda()

    def off(host, dev):
        return (host.data_ptr() - dev.data_ptr()) // host.element_size()
    r_gu = Remap(table, off(host_gu, slots[0]), off(host_gs, slots[2]))
    r_dn = Remap(table, off(host_dn, slots[1]), off(host_ds, slots[3]))
    x = torch.randn(1, H, device="cuda").to(torch.bfloat16)
    ids = torch.tensor([9, 0, 5, 13], device="cuda")
    w = torch.rand(1, k, device="cuda")

    def run(gu, dn, gs, ds, remap=(None, None)):
        act = moe_gate_up_silu_triton(x, gu, ids, scale=gs, remap=remap[0])
        return act, moe_down_combine_triton(act, dn, ids, w, 1, k, scale=ds, remap=remap[1])
    want = run(*stacked)
    got = run(*slots, remap=(r_gu, r_dn))
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(*slots, remap=(r_gu, r_dn))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(want, captured))


def test_reads_in_place_capture_the_step_and_serve_the_copy_steps_tokens(tmp_path):
    """fp8-row experts, bf16, two slots of eight a layer, misses read in place: the decode
    step is captured (CUDA graphs), experts are admitted between steps, and the greedy tokens
    equal the uncaptured copy step's (the same prompt path and decode kernels; all-resident
    bf16 prefills through grouped matmuls, another rounding, so it is compared on the CPU:
    tests/experts/test_in_place.py)."""
    path = write_synthetic("tiny-moe", tmp_path / "moe8.ninfer", recipe="fp8-row")

    def admit_on_any_difference(engine):  # 48 steps of 8 experts: LFU's z = 2 seldom admits
        for tier in engine.model.expert_tiers.layers.values():
            tier.map.policy.z = 0.0
    got, snap, engine = serve(path, tokens=48, expert_vram_mib=2 * 4 * FP8_MIB,
                              expert_miss="read", before_start=admit_on_any_difference)
    synced, _, _ = serve(path, tokens=48, expert_vram_mib=2 * 4 * FP8_MIB, expert_miss="copy")
    assert engine.runner.graphs is not None and engine.runner.graphs.capture
    tiers = engine.model.expert_tiers
    assert tiers.capturable and tiers.host.buffer.is_pinned()
    reads = [t.in_place for t in tiers.layers.values()]
    assert sum(r.read_pairs for r in reads) > 0 and sum(r.admitted for r in reads) > 0
    assert snap.experts.misses > 0 and snap.experts.hits > 0
    assert got == synced


def test_a_cpu_share_runs_its_misses_on_the_host_inside_the_captured_step(tmp_path):
    """`--expert-cpu-share 0.5`: the decode step is still captured, half of each layer-step's
    misses map to the zero row and the worker thread computes their pairs (the host jobs'
    counters and the stats' CPU share move); the request completes. Its tokens may differ
    from the read path's by the CPU's fp32 arithmetic (tests/experts/test_host_jobs.py bounds
    one layer)."""
    path = write_synthetic("tiny-moe", tmp_path / "moe8.ninfer", recipe="fp8-row")
    tokens, snap, engine = serve(path, tokens=48, expert_vram_mib=2 * 4 * FP8_MIB,
                                 expert_miss="read", expert_cpu_share=0.5)
    assert len(tokens) == 48
    assert engine.runner.graphs is not None and engine.runner.graphs.capture
    tiers = engine.model.expert_tiers
    assert tiers.cpu_share == 0.5
    assert all(t.in_place.split[:5].tolist() == [0, 1, 1, 2, 2] for t in tiers.layers.values())
    jobs = engine.runner.graphs.decoder.core.host_jobs
    assert jobs.active and jobs.totals()[0] > 0
    assert snap.experts.cpu_share > 0
