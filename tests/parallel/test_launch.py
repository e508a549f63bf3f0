"""`--tp 2`'s launcher, on the CPU (gloo) or two GPUs (nccl): `tensor_parallel_engine` spawns
rank 1 from the artifact file and serves tp1's greedy tokens as rank 0; a rank that dies (killed, no collective
running) fails the engine at once through the process watch."""
from __future__ import annotations

import asyncio
import multiprocessing
import time

import pytest
import torch

from ninfer_engine.artifact.synth import write_synthetic
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.parallel.launch import tensor_parallel_engine
from ninfer_engine.types import GenerationRequest, SamplingParams

PROMPT = tuple(range(1000, 1011))


def _greedy(engine, max_tokens: int = 4) -> list[int]:
    async def run():
        request = GenerationRequest("r", PROMPT, SamplingParams(temperature=0.0), max_tokens,
                                    ignore_eos=True)
        return [t async for e in engine.submit(request) for t in e.token_ids]

    return asyncio.run(run())


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason="--tp 2 on a CUDA machine needs two GPUs (this one has one)")
def test_launcher_serves_tp1_tokens_and_a_killed_rank_fails_the_engine(tmp_path,
                                                                       rendezvous_env):
    path = write_synthetic("tiny-dense", tmp_path / "tiny.ninfer")
    config = EngineConfig(artifact=path, max_context=256, prefill_chunk=8, no_verify=True)
    tp1 = Engine(config)
    tp1.start()
    expected = _greedy(tp1)
    tp1.stop()
    engine = tensor_parallel_engine(EngineConfig(artifact=path, max_context=256,
                                                 prefill_chunk=8, no_verify=True, tp=2,
                                                 devices=(0, 1)))
    failed = []
    engine.add_failure_listener(failed.append)
    engine.start()
    try:
        assert _greedy(engine) == expected
        rank1 = next(p for p in multiprocessing.active_children() if p.name == "rank 1")
        killed = time.monotonic()
        rank1.kill()
        while engine.state.value != "failed" and time.monotonic() - killed < 10:
            time.sleep(0.01)
        assert engine.state.value == "failed" and len(failed) == 1
        assert "rank 1 exited" in failed[0]
        assert time.monotonic() - killed < 2.0
    finally:
        engine.stop()
