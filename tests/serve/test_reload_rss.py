"""Reloads do not grow the process (issue 24: 1.23 -> 2.03 -> 2.58 GB over three reloads).

The supervisor reloads the default model's engine in this process ten times; each engine serves
one short greedy request before the next reload. The process RSS after each reload (once warm:
the first load and two reloads have set up torch, the tokenizer and the allocator's arenas) must
stay within 5 % of the warm figure, none may exceed the first load's by a tenth (a leak at the
first reload alone), and no engine or engine thread may outlive its reload.
"""
from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import psutil
import pytest
from server_process import MODEL, NEEDS_MODEL

from ninfer_engine.supervisor import Supervisor
from ninfer_engine.types import GenerationRequest, SamplingParams

pytestmark = NEEDS_MODEL

RELOADS = 10
# reloads before the figure the others are held to: the RSS settles after two (measured on
# the 2-core box: 1128 MiB after the first, then 1153-1175 MiB alternating for ten more)
WARMUP = 2
TOLERANCE = 0.05  # issue 24: RSS stable over 10 reloads within 5 %
# and no reload (the warm-up's included) above the first load by a tenth: one leaked copy of
# the default model's weights is ~55 % of it (measured: after load 1091 MiB, reloads <= +3.8 %)
FIRST_LOAD_TOLERANCE = 0.10


def serve_one(supervisor: Supervisor, n: int) -> int:
    """One short greedy request through the supervisor; the number of tokens it produced."""
    prompt = supervisor.tokenizer.encode(supervisor.chat_template.render(
        [{"role": "user", "content": "Name a fruit."}]))
    request = GenerationRequest(f"rss-{n}", tuple(prompt), SamplingParams(temperature=0.0),
                                max_tokens=4)

    async def run() -> int:
        return sum([len(e.token_ids) async for e in supervisor.submit(request)])

    return asyncio.run(run())


@pytest.mark.slow  # ~50 s on the 2-core box (ten model loads): run with -m slow
def test_rss_stable_over_ten_reloads():
    process = psutil.Process()
    supervisor = Supervisor([str(MODEL)])
    supervisor.load()
    try:
        assert serve_one(supervisor, 0) > 0
        first_rss = process.memory_info().rss
        warmup_rss = []
        for n in range(WARMUP):  # warm: later engines are built where earlier ones were freed
            supervisor.reload()
            assert serve_one(supervisor, n + 1) > 0
            warmup_rss.append(process.memory_info().rss)
        warm_rss = process.memory_info().rss
        warm_threads = threading.active_count()
        rss: list[int] = []
        engines: list[weakref.ref] = []
        for n in range(RELOADS):
            engines.append(weakref.ref(supervisor._current()))
            supervisor.reload()
            assert serve_one(supervisor, WARMUP + n + 1) > 0
            rss.append(process.memory_info().rss)
            assert threading.active_count() <= warm_threads, threading.enumerate()
        gc.collect()
        assert all(ref() is None for ref in engines), "an old engine is still referenced"
    finally:
        supervisor.stop()
    mib = [f"{r / 2**20:.0f}" for r in rss]
    assert max(rss) <= warm_rss * (1 + TOLERANCE), (f"{warm_rss / 2**20:.0f} MiB warm", mib)
    assert max(warmup_rss + rss) <= first_rss * (1 + FIRST_LOAD_TOLERANCE), (
        f"{first_rss / 2**20:.0f} MiB after the first load", warmup_rss, mib)
    # the ledger outlives reloads: every request is still counted
    assert sum(n for _, n in supervisor.ledger.latency().totals) == 1 + WARMUP + RELOADS
