"""Host time of the engine's step under a served-like burst, by function (cProfile on the
engine thread only), on a real artifact.

    python3 bench/profile_served_step.py MODEL.ninfer [--batch 8] [--tokens 256] [--rounds 2]

B requests of a random 120-token prompt and `--tokens` output tokens (ignore_eos) are submitted
at once, `--rounds` times; prints steps, wall time per step and the top functions by own time
and by cumulative time. For finding where a small model's step loses time to Python.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402


async def _burst(engine, batch, tokens, vocab, round_):
    async def one(i):
        rng = random.Random(round_ * 100 + i)
        request = GenerationRequest(f"r{round_}-{i}", tuple(rng.randrange(vocab) for _ in range(120)),
                                    SamplingParams(temperature=0.0), max_tokens=tokens,
                                    ignore_eos=True)
        async for _ in engine.submit(request):
            pass
    await asyncio.gather(*(one(i) for i in range(batch)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(EngineConfig(artifact=args.model, max_concurrency=args.batch,
                                 max_context=8192, kv_capacity=65536, no_verify=True))
    profile, steps = cProfile.Profile(), [0]
    step_once = engine._step_once

    def profiled():
        profile.enable()
        try:
            steps[0] += 1
            return step_once()
        finally:
            profile.disable()
    engine._step_once = profiled
    engine.start()
    asyncio.run(_burst(engine, args.batch, 8, engine.model.vocab_size, -1))  # warm-up
    profile.clear()
    steps[0] = 0
    start = time.perf_counter()
    for r in range(args.rounds):
        asyncio.run(_burst(engine, args.batch, args.tokens, engine.model.vocab_size, r))
    wall = time.perf_counter() - start
    engine.stop()
    print(f"{steps[0]} steps in {wall:.2f} s: {1e3 * wall / max(steps[0], 1):.2f} ms a step, "
          f"{args.rounds * args.batch * args.tokens / wall:.0f} tok/s")
    for key in ("tottime", "cumtime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    main()
