"""The serving engine with offloaded experts (the tiny seeded Qwen3.5-MoE of the engine tests:
8 experts, top-2, 4 MoE layers, on the CPU reference): greedy output
equal to every expert resident, the snapshot's expert figures, and `--elastic` lending that KV
growth takes back without failing the request."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.engine_load import EngineLoadError
from ninfer_engine.types import GenerationRequest, SamplingParams
from tests.engine.hybrid_helpers import HybridArtifact

EXPERT_MIB = (48 * 64 + 64 * 24) * 4 / 2**20  # one expert (H 64, I 24) in fp32
PROMPT = tuple(range(5, 105))


@pytest.fixture(scope="module")
def artifact():
    return HybridArtifact("qwen3_5_moe")


def run(artifact, new_tokens: int, **flags):
    """(tokens of one greedy request, the engine's last snapshot), the engine stopped."""
    # fp32 on a CUDA machine too, so an expert has the bytes the budgets here count
    engine = Engine(EngineConfig(artifact=Path("tiny.ninfer"), max_context=1024,
                                 cuda_dtype="fp32", **flags), artifact)
    engine.start()
    request = GenerationRequest("r", PROMPT, SamplingParams(temperature=0.0), new_tokens,
                                ignore_eos=True)

    async def collect():
        return [e async for e in engine.submit(request)]

    try:
        events = asyncio.run(collect())
        snapshot = engine.snapshot()
    finally:
        engine.stop()
    assert events[-1].finish == "length", events[-1]
    return [t for e in events for t in e.token_ids], snapshot


@pytest.fixture(scope="module")
def resident(artifact):
    return run(artifact, 120)[0]


def test_copied_misses_serve_the_same_tokens(artifact, resident):
    """Two of eight experts a layer on the "device", misses copied: the same 40 greedy tokens
    (prompt steps included), and the snapshot counts the traffic."""
    tokens, snap = run(artifact, 40, expert_vram_mib=2 * 4 * EXPERT_MIB, expert_miss="copy")
    assert tokens == resident[:40]
    x = snap.experts
    assert (x.slots, x.resident, x.cached, x.lent_pages, x.cpu_share) == (8, 8, 8, 0, 0.0)
    assert x.hits > 0 and x.misses > 0 and x.bytes_copied > 0
    assert snap.devices[0].expert_slots == 8 * round(EXPERT_MIB * 2**20)
    assert snap.host.pinned_experts == 8 * 4 * round(EXPERT_MIB * 2**20)


def test_cpu_misses_show_their_share(artifact, resident):
    tokens, snap = run(artifact, 16, expert_vram_mib=2 * 4 * EXPERT_MIB, expert_miss="cpu")
    assert 0.0 < snap.experts.cpu_share < 1.0 and snap.experts.bytes_copied == 0
    assert len(tokens) == 16  # fp32 on both sides here: no token is expected to move


def test_kv_growth_takes_lent_pages_back_and_the_request_completes(artifact, resident):
    """--elastic with a one-page grow step: the 15 pages of capacity not grown into are lent
    as 5 slots a layer (3 pages each: 4 layers × 18 KiB over 32 KiB pages), so every growth of
    the pool for a 100-token prompt and 120 output tokens must take lent pages back first; the
    request completes with the all-resident engine's tokens."""
    tokens, snap = run(artifact, 120, expert_vram_mib=2 * 4 * EXPERT_MIB, expert_miss="copy",
                       elastic=True, kv_grow=64, kv_lease_window=16)
    assert tokens == resident
    kv = snap.kv
    assert kv.total == 16 and kv.used + kv.cached + kv.free + kv.lent == kv.total
    # 220 positions need 4 pages grown: at most the other 12 stay lent, in whole 3-page slots
    assert kv.lent == snap.experts.lent_pages <= 16 - 4 and kv.lent % 3 == 0
    assert snap.experts.slots == 4 * (2 + kv.lent // 3) < 4 * 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="the engine runs on CUDA here")
def test_auto_cpu_share_is_accepted_on_the_cpu_engine(artifact, resident):
    """`--expert-cpu-share auto` on the CPU engine: every MoE layer gets its split
    (`cpu_layers` 4), which only the captured step (CUDA: `HybridStep`'s host jobs) applies;
    the CPU engine's eager step runs its misses by the miss path, so the tokens are the
    all-resident engine's and no pair counts as the host jobs'."""
    tokens, snap = run(artifact, 40, expert_vram_mib=2 * 4 * EXPERT_MIB, expert_miss="read",
                       expert_cpu_share="auto")
    assert tokens == resident[:40]
    assert snap.experts.cpu_layers == 4 and snap.experts.cpu_share == 0.0
    assert snap.experts.misses > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cpu_share_on_cuda_refuses_experts_the_host_kernel_cannot_read(artifact):
    """On CUDA the host's share of the experts runs the compiled fp8-row kernel: this
    artifact's fp32 experts stop the load with one line naming the flag."""
    with pytest.raises(EngineLoadError, match="--expert-cpu-share: .*fp8-row experts only"):
        run(artifact, 4, expert_vram_mib=2 * 4 * EXPERT_MIB, expert_miss="read",
            expert_cpu_share="auto")
