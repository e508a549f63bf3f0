"""`GET /metrics` (contract §12): Prometheus text from `prometheus-client`, every name `ninfer:`.

Two sources, one registry per application:
- `RequestMetrics` counters and histograms, fed by finished requests through `observers`;
- `SnapshotCollector`, which reads one `EngineStats` snapshot per scrape for the gauges and the
  engine's own monotonic totals (expert cache, speculation).

The route needs the API key when one is set (the app's auth middleware) and never exposes
prompts, outputs or keys.
"""
from __future__ import annotations

from typing import Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import Timings, Usage

from .context import ENGINE

# No `*_created` companion series: they double the exposition and nothing reads them (vLLM
# turns them off the same way; the switch is process-wide).
disable_created_metrics()

PREFIX = "ninfer:"
ENGINE_STATES = ("loading", "ready", "failed", "reloading")
MEMORY_CATEGORIES = ("weights", "kv_pool", "expert_slots", "workspace", "free")

# Buckets follow vLLM's, so dashboards built for `vllm:` histograms read ours the same way.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class RequestMetrics:
    """The registry behind `/metrics` and the per-request series that finished requests feed."""

    def __init__(self, snapshot: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.success = Counter(f"{PREFIX}request_success", "Requests that finished normally.",
                               ["finish_reason"], registry=r)
        for reason in ("stop", "length"):
            self.success.labels(reason)  # export 0 before the first request finishes
        self.rejected = Counter(f"{PREFIX}requests_rejected",
                                "Generation requests answered with an error before any output.",
                                ["code"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens",
                                     "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens",
                                         "Output tokens of finished requests.", registry=r)
        self.prefix_queries = Counter(f"{PREFIX}prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.", registry=r)
        self.prefix_hits = Counter(f"{PREFIX}prefix_cache_hits",
                                   "Prompt tokens served from the prefix cache.", registry=r)
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds",
                              "From the request's arrival to its first output token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}inter_token_latency_seconds",
                             "Mean time between output tokens, one sample per finished request.",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds",
                             "From the request's arrival to its last output token.",
                             buckets=E2E_BUCKETS, registry=r)
        r.register(SnapshotCollector(snapshot))

    def request_done(self, finish: str, usage: Usage, timings: Timings,
                     ttft_s: float | None) -> None:
        """One finished request; its times are the engine's, counted from arrival."""
        self.success.labels(finish).inc()
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        self.prefix_queries.inc(usage.prompt_tokens)
        self.prefix_hits.inc(usage.cached_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if timings.predicted_n > 1 and timings.decode_s > 0:
            self.itl.observe(timings.decode_s / (timings.predicted_n - 1))
        self.e2e.observe(timings.queue_s + timings.prefill_s + timings.decode_s)

    def request_rejected(self, code: str | None) -> None:
        self.rejected.labels(code or "unknown").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


METRICS = web.AppKey("ninfer_metrics", RequestMetrics)


class SnapshotCollector(Collector):
    """Gauges and engine totals read from the latest `EngineStats` at scrape time."""

    def __init__(self, snapshot: Callable[[], EngineStats]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []  # the series depend on the snapshot (experts and speculation are optional)

    def collect(self) -> Iterator[Metric]:
        stats = self._snapshot()
        yield _gauge("num_requests_running", "Requests admitted to the engine.",
                     len(stats.queue.running))
        yield _gauge("num_requests_waiting",
                     "Requests queued for admission (waiting at a paused gate included).",
                     len(stats.queue.pending))
        yield from _latency_metrics(stats)
        kv = stats.kv
        yield _gauge("kv_pages_total", "KV pool pages.", kv.total)
        yield _gauge("kv_pages_used", "KV pages held by requests.", kv.used)
        yield _gauge("kv_pages_cached", "Idle KV pages the prefix cache keeps (evictable).",
                     kv.cached)
        yield _gauge("kv_pages_lent", "KV pages lent to expert slots.", kv.lent)
        yield _gauge("kv_cache_usage_perc", "Fraction of KV pages in use (0..1).",
                     kv.used / kv.total if kv.total else 0.0)
        slots = stats.state_slots
        total = GaugeMetricFamily(f"{PREFIX}state_slots_total",
                                  "Recurrent-state slots (hybrid models).", labels=["kind"])
        used = GaugeMetricFamily(f"{PREFIX}state_slots_used",
                                 "Recurrent-state slots held.", labels=["kind"])
        for kind in ("running", "checkpoint"):
            total.add_metric([kind], getattr(slots, f"{kind}_total"))
            used.add_metric([kind], getattr(slots, f"{kind}_used"))
        yield total
        yield used
        yield _gauge("prefix_checkpoints", "Prefix-reuse checkpoints kept.", slots.checkpoints)
        tree = stats.prefix
        yield _gauge("prefix_tree_pages", "KV pages the prefix tree references.", tree.pages)
        yield _gauge("prefix_tree_snapshots", "Recurrent-state snapshots at prefix-tree nodes.",
                     tree.snapshots)
        yield _counter("prefix_tree_evicted_pages",
                       "Pages the prefix tree gave back under pressure.", tree.evicted_pages)
        yield _gauge("prefix_host_pages", "KV pages the prefix cache keeps in the host tier.",
                     tree.host_pages)
        yield _gauge("prefix_host_pages_total", "Pages of the host tier (--host-kv-mib).",
                     tree.host_total)
        yield _gauge("prefix_host_snapshots", "Recurrent-state snapshots in host state slots.",
                     tree.host_snapshots)
        yield _counter("prefix_host_restored_pages",
                       "Host-tier pages copied back to the device for a hit.",
                       tree.host_restored_pages)
        yield _counter("steps_failed", "Engine steps that raised: the requests each carried "
                       "ended with an error, and the engine went on.", stats.counters.steps_failed)
        yield from _expert_metrics(stats)
        yield from _spec_metrics(stats)
        yield from _vision_metrics(stats)
        memory = GaugeMetricFamily(f"{PREFIX}device_memory_bytes", "Device memory by category.",
                                   labels=["device", "category"])
        for device in stats.devices:
            for category in MEMORY_CATEGORIES:
                memory.add_metric([device.name, category], getattr(device, category))
        yield memory
        state = GaugeMetricFamily(f"{PREFIX}engine_state", "1 for the engine's current state.",
                                  labels=["state"])
        for name in ENGINE_STATES:
            state.add_metric([name], 1.0 if stats.state == name else 0.0)
        yield state


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}{name}", documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}{name}", documentation, value=value)


def _latency_metrics(stats: EngineStats) -> Iterator[Metric]:
    """The console's latency block: quantiles and ends over the last minute."""
    latency = stats.latency
    quantiles = GaugeMetricFamily(
        f"{PREFIX}request_latency_window_seconds",
        f"Latency quantiles of requests that ended in the last {latency.window_s:.0f} s "
        "(ttft, itl, e2e, queue; all from arrival).", labels=["kind", "quantile"])
    for kind in ("ttft", "itl", "e2e", "queue"):
        p = getattr(latency, kind)
        for q, value in (("0.5", p.p50), ("0.95", p.p95), ("0.99", p.p99)):
            quantiles.add_metric([kind, q], value)
    yield quantiles
    yield _gauge("request_rate_window", "Requests that ended per second over the window.",
                 latency.rate_per_s)
    ends = GaugeMetricFamily(f"{PREFIX}requests_window",
                             "Requests that ended in the window, by finish reason or error code.",
                             labels=["outcome"])
    for outcome, n in latency.outcomes:
        ends.add_metric([outcome], n)
    yield ends


def _expert_metrics(stats: EngineStats) -> Iterator[Metric]:
    experts = stats.experts
    if experts is None:  # a dense model has no expert cache
        return
    yield _gauge("expert_cache_slots", "Device slots for routed experts.", experts.slots)
    yield _gauge("expert_cache_resident", "Routed experts resident on the device.",
                 experts.resident)
    yield _gauge("expert_cache_cached", "Routed experts in evictable device slots.",
                 experts.cached)
    yield _gauge("expert_cache_lent_pages", "KV pages lent to expert slots.", experts.lent_pages)
    yield _gauge("expert_cpu_share", "Fraction of expert work done on the CPU.", experts.cpu_share)
    yield _gauge("expert_cpu_layers",
                 "MoE layers that hand some of their missed experts to the CPU.",
                 experts.cpu_layers)
    yield _counter("expert_cache_hits", "Expert lookups served from a device slot.", experts.hits)
    yield _counter("expert_cache_misses", "Expert lookups that missed the device slots.",
                   experts.misses)
    yield _counter("expert_copied_bytes", "Bytes of routed experts copied from host RAM into "
                   "device slots.", experts.bytes_copied)


def _spec_metrics(stats: EngineStats) -> Iterator[Metric]:
    spec = stats.spec
    if spec is None:  # speculation off
        return
    yield _counter("spec_decode_num_drafts", "Speculative rounds.", spec.rounds)
    yield _counter("spec_decode_num_draft_tokens", "Drafted tokens.", spec.drafted)
    yield _counter("spec_decode_num_accepted_tokens", "Accepted draft tokens.", spec.accepted)
    per_pos = CounterMetricFamily(f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
                                  "Accepted draft tokens by position in the draft (from 0).",
                                  labels=["position"])
    for position, rate in enumerate(spec.per_position):
        # The engine publishes per-position acceptance rates; rate x rounds is the count.
        per_pos.add_metric([str(position)], round(rate * spec.rounds))
    yield per_pos


def _vision_metrics(stats: EngineStats) -> Iterator[Metric]:
    vision = stats.vision
    if vision is None:  # no `--vision`
        return
    yield _counter("vision_encoded_media", "Images and videos the vision tower encoded.",
                   vision.encoded)
    yield _counter("vision_encoder_seconds", "Time the vision tower spent encoding.",
                   vision.encoder_s)
    yield _counter("vision_media_tokens", "Media tokens prefilled with encoder rows.",
                   vision.media_tokens)
    yield _counter("vision_cache_hits", "Media whose encoder rows came from the cache.",
                   vision.cache_hits)
    yield _gauge("vision_cache_bytes", "Encoder rows held by the media cache.", vision.cache_bytes)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    """Create the application's metrics registry and serve it at `GET /metrics`."""
    app[METRICS] = RequestMetrics(app[ENGINE].snapshot)
    app.router.add_get("/metrics", metrics)
