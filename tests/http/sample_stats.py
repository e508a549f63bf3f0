"""A busy `EngineStats` snapshot (MoE model, MTP speculation, queued and running requests)."""
from __future__ import annotations

import time

from ninfer_engine.stats import (
    Counters,
    DeviceMemory,
    EngineStats,
    ExpertStats,
    HostMemory,
    KvStats,
    PrefixStats,
    QueueStats,
    RequestView,
    SpecStats,
    StateSlotStats,
    Throughput,
)

GIB = 1024 ** 3


def busy_stats(state: str = "ready") -> EngineStats:
    now = time.time()
    return EngineStats(
        at=now,
        state=state,
        model_id="fake-model",
        profile="flash-next",
        started_at=now - 120.0,
        devices=(
            DeviceMemory("cuda:0", 16 * GIB, weights=9 * GIB, kv_pool=3 * GIB,
                         expert_slots=2 * GIB, workspace=GIB, free=GIB),
            DeviceMemory("cuda:1", 16 * GIB, weights=9 * GIB, kv_pool=3 * GIB,
                         expert_slots=2 * GIB, workspace=GIB, free=GIB),
        ),
        host=HostMemory(total=128 * GIB, used=80 * GIB, process_rss=70 * GIB,
                        pinned_experts=60 * GIB),
        kv=KvStats(page_tokens=64, total=400, used=100, free=300, lent=50, dtype="int8",
                   per_request=(("req_a", 60), ("req_b", 40))),
        state_slots=StateSlotStats(running_total=4, running_used=2, checkpoint_total=4,
                                   checkpoint_used=3, checkpoints=3),
        prefix=PrefixStats(lookups=10, hits=6, lookup_tokens=9000, hit_tokens=5000, pages=120,
                           nodes=120, snapshots=3, evicted_pages=7, host_pages=40,
                           host_total=128, host_snapshots=5, host_snapshot_total=8,
                           host_restored_pages=33),
        experts=ExpertStats(slots=384, resident=371, lent_pages=50, hits=9000, misses=1000,
                            cpu_share=0.18, cached=371, bytes_copied=3 * 2**30, cpu_layers=5),
        spec=SpecStats(backend="mtp", window=3, rounds=1000, drafted=3000, accepted=2040,
                       per_position=(0.84, 0.68, 0.52)),
        queue=QueueStats(
            pending=(RequestView("req_c", "queued", prompt_tokens=900, waited_s=0.25),),
            running=(RequestView("req_a", "decode", 3000, 800, tok_s=41.5, ttft_s=0.3),
                     RequestView("req_b", "prefill", 2500, 0)),
        ),
        throughput=Throughput(decode_tok_s=41.5, prefill_tok_s=2048.0, batch=1.5,
                              interval_s=1.0, decode_tokens=41, prefill_tokens=2048),
        counters=Counters(requests_done=7, prompt_tokens=20000, generation_tokens=5000,
                          prefix_cache_queries=20000, prefix_cache_hits=12000),
    )
