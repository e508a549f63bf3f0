"""`EngineStats`: the one immutable snapshot the engine publishes for every observer.

The console panels, the headless throughput line, `/metrics`, `/engine/state` and the request
log's `throughput` event read these snapshots and nothing else of the engine.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .types import Timings


@dataclass(frozen=True)
class DeviceMemory:
    name: str  # "cuda:0", ...
    total: int
    weights: int = 0
    kv_pool: int = 0
    expert_slots: int = 0
    workspace: int = 0
    free: int = 0


@dataclass(frozen=True)
class HostMemory:
    total: int = 0
    used: int = 0
    process_rss: int = 0
    process_cpu: float = 0.0  # % of one core over the last refresh (as top: 2 busy cores 200)
    machine_cpu: float = 0.0  # % of all cores, every process
    cpus: int = 0
    pinned_experts: int = 0
    pinned_kv_tier: int = 0
    pinned_state_tier: int = 0


@dataclass(frozen=True)
class KvStats:
    page_tokens: int = 64
    total: int = 0
    used: int = 0
    free: int = 0
    lent: int = 0
    dtype: str = "bf16"
    per_request: tuple[tuple[str, int], ...] = ()  # (request id, pages)
    # idle pages only the prefix tree keeps: reusable, evicted before any request waits, so
    # not `used` (used + cached + free + lent = total, as vLLM leaves cached blocks out)
    cached: int = 0


@dataclass(frozen=True)
class StateSlotStats:
    """Recurrent-state slots (hybrid models: one per running sequence, one per prefix
    checkpoint; totals 0 for attention-only models) and the prefix checkpoints kept."""

    running_total: int = 0
    running_used: int = 0
    checkpoint_total: int = 0
    checkpoint_used: int = 0
    checkpoints: int = 0  # prefix-tree restore points: snapshots (hybrid), nodes (llama)


@dataclass(frozen=True)
class PrefixStats:
    """The prefix tree (`kv.radix`): lookups since start (one per admitted request with reuse
    on) and what they restored, and what the tree holds now."""

    lookups: int = 0
    hits: int = 0  # lookups that restored at least one token
    lookup_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # ... restored instead of computed
    pages: int = 0  # KV pages the tree references (shared with running requests or idle)
    nodes: int = 0
    snapshots: int = 0  # recurrent-state snapshots at tree nodes (hybrid family)
    evicted_pages: int = 0  # pages the tree gave back under pressure, since start
    # the host tier (`--host-kv-mib`, `--host-state-slots`): pages and snapshots held there
    # of its totals, and host pages copied back for a hit since start
    host_pages: int = 0
    host_total: int = 0
    host_snapshots: int = 0
    host_snapshot_total: int = 0
    host_restored_pages: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


@dataclass(frozen=True)
class ExpertStats:
    """The routed experts and their device-slot cache. `experts`/`active`/`layers` describe the
    model (routed experts per MoE layer, experts each token uses, MoE layers); with every expert
    resident where it runs (no cache, e.g. on the CPU) `slots` is 0. With a cache
    (`ninfer_engine.experts`): `slots` over all MoE layers (lent ones included), `resident`
    routed experts on the device, `cached` of them in evictable slots, hits and misses per
    (step, layer, distinct expert), `cpu_share` of the routed (token, expert) pairs computed on
    the CPU, `bytes_copied` host → slot since start, `cpu_layers` the MoE layers whose misses
    the host's cores share now (`--expert-cpu-share`: a count of each layer-step's misses;
    0 while `auto`'s policy has the hand-off off)."""

    slots: int = 0
    resident: int = 0
    lent_pages: int = 0
    hits: int = 0
    misses: int = 0
    cpu_share: float = 0.0
    experts: int = 0
    active: int = 0
    layers: int = 0
    cached: int = 0
    bytes_copied: int = 0
    cpu_layers: int = 0


@dataclass(frozen=True)
class SpecStats:
    backend: str = "off"
    window: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: tuple[float, ...] = ()

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0


@dataclass(frozen=True)
class VisionStats:
    """The vision tower (`--vision`) since start: media it encoded and its time on them, media
    tokens spliced into prompts, and its cache of encoder rows by digest and grid."""

    encoded: int = 0
    encoder_s: float = 0.0
    media_tokens: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes: int = 0
    cache_capacity: int = 0


@dataclass(frozen=True)
class RequestView:
    """One request. `phase` is "queued" | "paused" | "prefill" | "decode" while it lives, then
    its end: "stop" | "length" | "cancelled" | "error" | "rejected" (`reason`: the error code).
    TTFT and `waited_s` count from the request's arrival at the server (`arrival.py`)."""

    id: str
    phase: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    tok_s: float = 0.0
    ttft_s: float | None = None
    waited_s: float = 0.0
    cached_tokens: int = 0
    reason: str | None = None
    client: str | None = None
    e2e_s: float | None = None


@dataclass(frozen=True)
class QueueStats:
    pending: tuple[RequestView, ...] = ()
    running: tuple[RequestView, ...] = ()
    recent: tuple[RequestView, ...] = ()


@dataclass(frozen=True)
class Throughput:
    """Rates over the engine's last closed interval (about a second); observers that report over
    their own interval use `interval_throughput` on two snapshots' `Counters` instead."""

    decode_tok_s: float = 0.0
    prefill_tok_s: float = 0.0
    batch: float = 0.0
    interval_s: float = 0.0
    decode_tokens: int = 0  # in the interval
    prefill_tokens: int = 0


@dataclass(frozen=True)
class Counters:
    """Monotonic totals since start (Prometheus counters read these)."""

    requests_done: int = 0  # finished: stop or length
    requests_failed: int = 0
    requests_cancelled: int = 0
    # the next four are tokens of finished requests, as /metrics' counters of the same names
    prompt_tokens: int = 0  # every prompt token, cached ones included (computed: prefill_tokens)
    generation_tokens: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # ... and restored from it instead of computed
    decode_tokens: int = 0  # computed in steps, finished or not
    prefill_tokens: int = 0
    steps: int = 0
    batch_rows: int = 0  # rows of every step (decode rows + one per prefill step)
    steps_failed: int = 0  # raised, and ended only the requests they carried (`step_failure`)


@dataclass(frozen=True)
class Percentiles:
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    n: int = 0


@dataclass(frozen=True)
class LatencyStats:
    """Requests that ended in the last `window_s` seconds, as the supervisor saw them.

    TTFT is from arrival (the HTTP request reached the server) to the first output token; ITL is
    the mean gap between a request's output tokens; e2e is arrival to the last token; queue is
    arrival to admission. `outcomes` counts the window's ends by reason ("stop", "length",
    "cancelled", "client_disconnected", or an error code such as "server_overloaded" (429) or
    "request_queue_timeout"); `totals` counts the same since the process started."""

    window_s: float = 60.0
    requests: int = 0
    rate_per_s: float = 0.0
    ttft: Percentiles = field(default_factory=Percentiles)
    itl: Percentiles = field(default_factory=Percentiles)
    e2e: Percentiles = field(default_factory=Percentiles)
    queue: Percentiles = field(default_factory=Percentiles)
    outcomes: tuple[tuple[str, int], ...] = ()
    totals: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class EngineStats:
    at: float
    state: str  # EngineState value
    model_id: str = ""
    profile: str | None = None
    started_at: float = 0.0
    load_progress: float | None = None
    failure: str | None = None
    devices: tuple[DeviceMemory, ...] = ()
    host: HostMemory = field(default_factory=HostMemory)
    kv: KvStats = field(default_factory=KvStats)
    state_slots: StateSlotStats = field(default_factory=StateSlotStats)
    prefix: PrefixStats = field(default_factory=PrefixStats)
    experts: ExpertStats | None = None
    spec: SpecStats | None = None
    vision: VisionStats | None = None  # None without `--vision`
    queue: QueueStats = field(default_factory=QueueStats)
    throughput: Throughput = field(default_factory=Throughput)
    counters: Counters = field(default_factory=Counters)
    latency: LatencyStats = field(default_factory=LatencyStats)
    admission: str = "open"  # "open" | "paused" | "draining"
    max_context: int = 0
    dtype: str = ""  # the model's compute dtype ("fp32", "bf16"); the KV's is `kv.dtype`
    engine_pid: int = 0  # the engine's process: not the server's under `engine_process`

    @property
    def live(self) -> bool:
        """True while the figures describe a serving engine (not loading, failed or stopped)."""
        return self.state == "ready"

    def to_dict(self) -> dict:
        return asdict(self)


SUCCESS = ("stop", "length")


def interval_throughput(before: EngineStats | None, after: EngineStats) -> Throughput:
    """Rates between two snapshots from their monotonic counters, over the time between them.

    A reload restarts the counters: an interval across one counts from zero (`started_at`)."""
    a = after.counters
    if before is None or before.started_at != after.started_at:
        b, since = Counters(), after.started_at
    else:
        b, since = before.counters, before.at
    elapsed = max(after.at - since, 0.0)
    steps = a.steps - b.steps
    decode, prefill = a.decode_tokens - b.decode_tokens, a.prefill_tokens - b.prefill_tokens
    return Throughput(
        decode_tok_s=decode / elapsed if elapsed > 0 else 0.0,
        prefill_tok_s=prefill / elapsed if elapsed > 0 else 0.0,
        batch=(a.batch_rows - b.batch_rows) / steps if steps > 0 else 0.0,
        interval_s=elapsed, decode_tokens=decode, prefill_tokens=prefill,
    )


def time_to_first_token(timings: Timings, output_tokens: int) -> float | None:
    """TTFT, the one definition: from arrival (queue wait included) to the first output token;
    None for a request that produced no token."""
    return timings.queue_s + timings.prefill_s if output_tokens else None
