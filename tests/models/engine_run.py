"""A started engine over a synthetic artifact, and greedy requests to it (the serving tests of
packed projections, fp8 experts and `--cpu-matmul`)."""

import asyncio
from contextlib import contextmanager

from ninfer_engine.artifact.synth import write_synthetic
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams


@contextmanager
def started_engine(path_dir, arch: str, recipe: str):
    """An engine serving a synthetic `arch` artifact written in `recipe`, stopped on exit."""
    path = write_synthetic(arch, path_dir / f"{arch}-{recipe}.ninfer", recipe=recipe)
    engine = Engine(EngineConfig(artifact=path, max_context=1024))
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


def greedy_events(engine, prompt: tuple[int, ...], max_tokens: int) -> list:
    """The events of one greedy request of exactly `max_tokens` tokens (EOS ignored), run to
    its end on a started engine."""
    request = GenerationRequest("r", prompt, SamplingParams(temperature=0.0),
                                max_tokens=max_tokens, ignore_eos=True)

    async def collect():
        return [e async for e in engine.submit(request)]

    return asyncio.run(collect())


def greedy_tokens(engine, rid: str, new_tokens: int = 24) -> list[int]:
    """The tokens of one greedy request over a fixed 100-token prompt."""
    request = GenerationRequest(rid, tuple(range(5, 105)), SamplingParams(temperature=0.0),
                                new_tokens)

    async def collect():
        return [t for e in [e async for e in engine.submit(request)] for t in e.token_ids]

    return asyncio.run(collect())
