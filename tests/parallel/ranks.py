"""Spawned tensor-parallel ranks for the tests: rank 0 runs an `Engine`, the others `Follower`s,
over gloo on 127.0.0.1, each building the same seeded tiny artifact."""
from __future__ import annotations

import asyncio
import os
import queue
import socket
import time
from pathlib import Path

import torch.multiprocessing as mp

from ninfer_engine.config import EngineConfig
from ninfer_engine.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
# (family, --tp-experts, --spec, tokens): llama's vocab 259 leaves rank 1 a shorter head (129
# of 130 rows); the qwen3_5 case drafts (prompt lookup), so its verify rows roll back on both
# ranks (`lockstep` KEEP): its first lookups find nothing, and a row waits longer after each
# (`speculation.MAX_EMPTY_PAUSE`), so it runs 20 tokens for rounds to come (6 drafted at tp1)
CASES = (("llama", "intermediate", None, 4), ("qwen3_5", "intermediate", "ngram", 20),
         ("qwen3_5_moe", "expert", None, 4), ("qwen3_5_moe", "intermediate", None, 4))
FAULT_CASE = ("qwen3_5", "intermediate", None, 12)
PROMPTS = (tuple(range(40, 53)), tuple(range(90, 75, -3)))  # 13 and 5 tokens


def artifact(family: str):
    if family == "llama":
        from tests.engine.helpers import FakeArtifact, tiny_llama

        return FakeArtifact(tiny_llama(seed=4, vocab_size=259, tie_word_embeddings=False))
    from tests.engine.hybrid_helpers import HybridArtifact

    return HybridArtifact(family)


def config(experts: str, spec: str | None = None) -> EngineConfig:
    return EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=8, max_context=256,
                        max_concurrency=2, tp_experts=experts, spec=spec,
                        draft_tokens=3 if spec else None)


def drafted(engine) -> int:
    return engine.speculator.stats().drafted if engine.speculator else 0


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


def _rank(rank: int, world: int, port: int, results) -> None:
    """Every case of `CASES`, then `FAULT_CASE` with a fault on rank 1 at its step 3."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch

    torch.set_num_threads(1)  # two ranks on a small CI box: no OpenMP teams spinning on each other
    from ninfer_engine.engine import Engine
    from ninfer_engine.parallel import join_from_env
    from ninfer_engine.parallel.follower import Follower, follower_main

    ranks = join_from_env(torch.device("cpu"))
    for family, experts, spec, tokens in CASES:
        if rank:
            Follower(config(experts, spec), artifact(family), ranks).run()
            continue
        engine = Engine(config(experts, spec), artifact(family), ranks=ranks)
        engine.start()
        out = generate(engine, tokens)
        results.put((family, experts, out, engine.state.value, drafted(engine)))
        engine.stop()
    family, experts, spec, tokens = FAULT_CASE
    if rank:  # the follower process's own entry point: a failure exits 2
        os.environ["NINFER_FAULT"] = "step:3@rank1"
        follower_main(config(experts, spec), rank, world, port, artifact(family))
        return
    engine = Engine(config(experts, spec), artifact(family), ranks=ranks)
    failed = []
    engine.add_failure_listener(lambda reason: failed.append(reason))
    engine.start()
    started = time.monotonic()
    out = generate(engine, tokens)
    results.put((family, experts, out, engine.state.value, time.monotonic() - started, failed))


def run_ranks(world: int = 2, timeout: float = 240.0) -> list:
    """Rank 0's results: one per case of `CASES`, then the fault case's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, results)) for r in range(world)]
    return collect(procs, results, len(CASES) + 1, timeout)


def collect(procs: list, results, count: int, timeout: float) -> list:
    """Start the rank processes, take up to `count` results (each within `timeout`), then end
    every process. The ranks run on the CPU (gloo) on a GPU machine too: CUDA is hidden from
    them."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a spawned process reads it at its CUDA start
    try:
        for p in procs:
            p.start()
    finally:
        if hidden is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    out = []
    try:
        for _ in range(count):
            out.append(results.get(timeout=timeout))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return out
