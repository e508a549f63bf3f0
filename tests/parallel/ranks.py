"""Spawned tensor-parallel ranks for the tests: rank 0 runs an `Engine`, the others `Follower`s,
over gloo on 127.0.0.1, each building the same seeded tiny artifact."""
from __future__ import annotations

import asyncio
import os
import queue
import socket
from pathlib import Path

import torch.multiprocessing as mp

from ninfer_engine.config import EngineConfig
from ninfer_engine.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
# (family, --tp-experts): llama's vocab 259 leaves rank 1 a shorter head (129 of 130 rows)
CASES = (("llama", "expert"), ("qwen3_5", "expert"), ("qwen3_5_moe", "expert"),
         ("qwen3_5_moe", "intermediate"))
PROMPTS = (tuple(range(40, 61)), tuple(range(90, 69, -3)))  # 21 and 7 tokens


def artifact(family: str):
    if family == "llama":
        from tests.engine.helpers import FakeArtifact, tiny_llama

        return FakeArtifact(tiny_llama(seed=4, vocab_size=259, tie_word_embeddings=False))
    from tests.engine.hybrid_helpers import HybridArtifact

    return HybridArtifact(family)


def config(experts: str) -> EngineConfig:
    return EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=8, max_context=256,
                        max_concurrency=2, tp_experts=experts)


def generate(engine, max_tokens: int) -> list[tuple[list[int], str | None]]:
    """Both prompts at once, greedy: (tokens, finish or error code) of each."""
    async def one(i, prompt):
        events = [e async for e in engine.submit(
            GenerationRequest(f"r{i}", prompt, GREEDY, max_tokens, ignore_eos=True))]
        last = events[-1]
        return ([t for e in events for t in e.token_ids],
                last.error.code if last.error else last.finish)

    async def both():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))

    return asyncio.run(both())


def _rank(rank: int, world: int, port: int, job: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch

    from ninfer_engine.engine import Engine
    from ninfer_engine.parallel import join_from_env
    from ninfer_engine.parallel.follower import Follower, follower_main

    if job == "fault" and rank:
        follower_main(config("expert"), rank, world, port, artifact("qwen3_5"))
        return
    ranks = join_from_env(torch.device("cpu"))
    cases = CASES if job == "greedy" else (("qwen3_5", "expert"),)
    for family, experts in cases:
        if rank:
            Follower(config(experts), artifact(family), ranks).run()
            continue
        engine = Engine(config(experts), artifact(family), ranks=ranks)
        engine.start()
        out = generate(engine, 6 if job == "greedy" else 12)
        results.put((family, experts, out, engine.state.value))
        engine.stop()


def run_ranks(job: str, world: int = 2, timeout: float = 240.0) -> list:
    """Rank 0's results of `job` ("greedy": every case; "fault": a fault on rank 1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, job, results))
             for r in range(world)]
    for p in procs:
        p.start()
    out = []
    try:
        for _ in range(len(CASES) if job == "greedy" else 1):
            out.append(results.get(timeout=timeout))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return out
