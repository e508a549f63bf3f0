"""The console's fake scenarios: each a fixed script of `EngineStats` frames (`SCENARIOS`, by
name: frame index -> stats) on a fixed clock, no randomness; `fake_feed.FakeSupervisor` plays
them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ninfer_engine.stats import (
    Counters,
    DeviceMemory,
    EngineStats,
    ExpertStats,
    HostMemory,
    KvStats,
    LatencyStats,
    Percentiles,
    QueueStats,
    RequestView,
    SpecStats,
    StateSlotStats,
    Throughput,
)

GIB = 1024**3
T0 = 1_790_000_000.0  # the fixed clock of every scenario
FRAME_S = 0.25
# Throughput wobble over the frames, as a fraction of each scenario's nominal rate.
WAVE = tuple(
    float(x)
    for x in "0.82 0.88 0.95 1.0 0.97 0.9 0.84 0.8 0.86 0.93 0.99 1.02 "
    "0.98 0.91 0.85 0.83 0.89 0.96 1.01 0.97 0.92 0.87 0.85 0.9".split()
)


def gpu(name: str, total: float, *parts: float) -> DeviceMemory:
    """A device of `total` GiB holding weights, KV pool, expert slots and workspace (GiB)."""
    free = total - sum(parts)
    return DeviceMemory(name, *(int(gib * GIB) for gib in (total, *parts, free)))


def req(
    id: str,
    phase: str,
    prompt: int,
    out: int = 0,
    tok_s: float = 0.0,
    ttft: float | None = None,
    waited: float = 0.0,
) -> RequestView:
    return RequestView(id, phase, prompt, out, tok_s, ttft, waited)


TWO_16G = (gpu("cuda:0", 16, 7.6, 4.2, 0, 1.1), gpu("cuda:1", 16, 7.4, 4.2, 0, 0.9))
ONE_H200 = (gpu("cuda:0", 139.8, 51.2, 72.0, 0, 4.5),)
RECENT = (
    req("r-0208", "stop", 1840, 512, 41.2, 0.31),
    req("r-0209", "length", 96, 88, 43.0, 0.12),
    replace(req("r-0210", "cancelled", 5200, 17, 39.5, 0.94), reason="client_disconnected"),
    replace(req("r-0207", "error", 300, waited=30.0), reason="request_queue_timeout"),
    req("r-0211", "stop", 730, 1024, 42.4, 0.22),
)
TOTALS = Counters(211, 1, 6, 1_934_210, 412_877, 1_934_210, 1_404_236)
LATENCY = LatencyStats(
    window_s=60.0, requests=23, rate_per_s=0.38,
    ttft=Percentiles(0.21, 0.94, 2.84, 19), itl=Percentiles(0.025, 0.031, 0.044, 19),
    e2e=Percentiles(11.8, 26.1, 31.0, 19), queue=Percentiles(0.004, 0.61, 2.9, 21),
    outcomes=(("cancelled", 1), ("length", 3), ("request_queue_timeout", 1), ("stop", 15),
              ("server_overloaded", 2), ("client_disconnected", 1)),
    totals=(("length", 41), ("stop", 170), ("cancelled", 6), ("internal_error", 1),
            ("server_overloaded", 9), ("request_queue_timeout", 4)),
)


def base(model: str, profile: str | None, devices: tuple[DeviceMemory, ...]) -> EngineStats:
    return EngineStats(
        at=T0,
        state="ready",
        model_id=model,
        profile=profile,
        started_at=T0 - 3723.0,
        devices=devices,
        host=HostMemory(int(125.8 * GIB), int(31.2 * GIB), int(9.4 * GIB), 112.0, 9.0, 32),
        queue=QueueStats(recent=RECENT),
        counters=TOTALS,
        latency=LATENCY,
        max_context=262_144,
    )


def spec_counters(i: int, per_position: tuple[float, ...], rounds_per_frame: int) -> SpecStats:
    """MTP counters after frame `i`: 5000 earlier rounds at exactly `per_position`, then
    `rounds_per_frame` rounds per frame whose acceptance follows WAVE around the same mean."""
    window = len(per_position)
    mean = sum(per_position) / window
    rounds, drafted, accepted = 5000, 5000 * window, round(5000 * sum(per_position))
    for frame in range(i + 1):
        rounds += rounds_per_frame
        drafted += rounds_per_frame * window
        accepted += round(rounds_per_frame * window * min(1.0, mean * WAVE[frame]))
    return SpecStats("mtp", window, rounds, drafted, accepted, per_position)


def idle(i: int) -> EngineStats:
    stats = base("qwen3.5-27b", "27b", TWO_16G)
    return replace(
        stats,
        kv=KvStats(64, 3072, 0, 3072, 0, "int8"),
        state_slots=StateSlotStats(1, 0, 4, 3, 3),  # --max-concurrency 1 --device-state-slots 4
        host=replace(stats.host, pinned_kv_tier=8 * GIB, pinned_state_tier=int(1.5 * GIB)),
        spec=spec_counters(0, (0.84, 0.68, 0.52), 0),
    )


def busy8(i: int) -> EngineStats:
    running = (
        req("r-0212", "decode", 2210, 1533, 38.9, 0.41),
        req("r-0213", "decode", 512, 901, 39.6, 0.18),
        req("r-0214", "decode", 18_400, 377, 36.1, 2.84),
        req("r-0215", "decode", 1024, 240, 39.0, 0.29),
        req("r-0216", "decode", 3300, 122, 38.2, 0.66),
        req("r-0217", "decode", 640, 35, 39.8, 0.21),
        req("r-0218", "prefill", 40_960),
        req("r-0219", "prefill", 7100),
    )
    pending = (
        req("r-0220", "queued", 830, waited=0.4),
        req("r-0221", "queued", 12_000, waited=1.2),
        req("r-0222", "queued", 95, waited=2.9),
    )
    pages = tuple(
        (view.id, -(-(view.prompt_tokens + view.output_tokens) // 64)) for view in running
    )
    used = sum(p for _, p in pages)
    return replace(
        base("qwen3.5-27b", None, ONE_H200),
        kv=KvStats(64, 9216, used, 9216 - used, 0, "bf16", pages),
        state_slots=StateSlotStats(8, 8, 8, 5, 5),  # --max-concurrency 8, as many checkpoint slots
        queue=QueueStats(pending, running, RECENT),
        throughput=Throughput(308.0 * WAVE[i], 5410.0 * WAVE[i], 8.0, FRAME_S),
    )


def failed(i: int) -> EngineStats:
    stats = idle(i)
    errors = (
        replace(req("r-0212", "error", 2210, 1533, 38.9, 0.41), reason="service_unavailable"),
        replace(req("r-0213", "error", 512, 901, 39.6, 0.18), reason="service_unavailable"),
    )
    return replace(
        stats,
        state="failed",
        kv=replace(stats.kv, used=0, per_request=()),  # as the supervisor clears a failed one
        queue=QueueStats(recent=RECENT[2:] + errors),
        failure="CUDA error: an illegal memory access was encountered "
        "(engine step 48213, runner.forward on cuda:1)",
        counters=replace(TOTALS, requests_failed=3),
    )


def cpu_only(i: int) -> EngineStats:
    return replace(
        base("SmolLM2-135M-Instruct", None, ()),
        host=HostMemory(int(15.5 * GIB), int(6.1 * GIB), int(0.9 * GIB), 188.0, 97.0, 2),
        kv=KvStats(64, 128, 14, 114, 0, "bf16", (("r-0003", 14),)),
        state_slots=StateSlotStats(checkpoints=1),  # attention only: KV checkpoints, no slots
        queue=QueueStats(running=(req("r-0003", "decode", 412, 486, 38.2, 0.61),)),
        throughput=Throughput(38.2 * WAVE[i], 0.0, 1.0, FRAME_S),
        counters=Counters(2, 0, 0, 1210, 3312),
    )


def moe_lending(i: int) -> EngineStats:
    devices = (gpu("cuda:0", 16, 9.1, 2.4, 3.2, 0.9), gpu("cuda:1", 16, 8.8, 2.4, 3.6, 0.8))
    stats = base("qwen3-next-80b-a3b", "flash-next", devices)
    return replace(
        stats,
        host=replace(
            stats.host,
            used=int(88.0 * GIB),
            process_rss=int(74.0 * GIB),
            pinned_experts=int(68.5 * GIB),
        ),
        kv=KvStats(64, 4096, 1210, 1350, 1536, "int8", (("r-0212", 1210),)),
        state_slots=StateSlotStats(1, 1, 1, 1, 1),  # flash-next: --max-concurrency 1
        experts=ExpertStats(384, 371, 1536, 812_345 + 40 * i, 98_211 + 5 * i, 0.18),
        spec=spec_counters(i, (0.78, 0.57, 0.39), 12),
        queue=QueueStats(
            (req("r-0213", "queued", 2048, waited=3.1),),
            (req("r-0212", "decode", 70_000, 3120, 37.6, 4.92),),
            RECENT,
        ),
        throughput=Throughput(37.6 * WAVE[i], 0.0, 1.0, FRAME_S),
    )


def spec_on(i: int) -> EngineStats:
    running = (
        req("r-0212", "decode", 3100, 780, 96.4, 0.35),
        req("r-0213", "decode", 820, 212, 92.8, 0.17),
    )
    return replace(
        base("qwen3.5-27b", None, ONE_H200),
        kv=KvStats(64, 9216, 78, 9138, 0, "bf16", (("r-0212", 61), ("r-0213", 17))),
        state_slots=StateSlotStats(4, 2, 4, 2, 2),  # --max-concurrency 4
        spec=spec_counters(i, (0.91, 0.79, 0.64), 30),
        queue=QueueStats(running=running, recent=RECENT),
        throughput=Throughput(189.2 * WAVE[i], 0.0, 2.0, FRAME_S),
    )


def paused(i: int) -> EngineStats:
    """cpu_only with admission paused: two requests wait at the gate, one more still runs."""
    stats = cpu_only(i)
    waiting = tuple(replace(req(rid, "paused", prompt, waited=waited + i * FRAME_S),
                            client=client)
                    for rid, prompt, waited, client in (("r-0004", 35, 4.2, "bench"),
                                                        ("r-0005", 2100, 1.0, None)))
    return replace(stats, admission="paused",
                   queue=replace(stats.queue, pending=waiting, recent=RECENT))


def reloading(i: int) -> EngineStats:
    """busy8 during a reload: no engine, so nothing live; the ledger's figures remain."""
    stats = busy8(i)
    return replace(stats, state="reloading", throughput=Throughput(),
                   queue=QueueStats(recent=RECENT), started_at=T0,
                   kv=replace(stats.kv, used=0, per_request=()))


SCENARIOS: dict[str, Callable[[int], EngineStats]] = {
    "idle": idle,
    "busy8": busy8,
    "paused": paused,
    "reloading": reloading,
    "failed": failed,
    "cpu_only": cpu_only,
    "moe_lending": moe_lending,
    "spec_on": spec_on,
}
