"""`EngineStats`: the one immutable snapshot the engine publishes for every observer.

The console panels, the headless throughput line, `/metrics`, `/engine/state` and the request
log's `throughput` event read these snapshots and nothing else of the engine.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


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


@dataclass(frozen=True)
class StateSlotStats:
    """Recurrent-state slots (hybrid models: one per running sequence, one per prefix
    checkpoint; totals 0 for attention-only models) and the prefix checkpoints kept."""

    running_total: int = 0
    running_used: int = 0
    checkpoint_total: int = 0
    checkpoint_used: int = 0
    checkpoints: int = 0  # prefix checkpoints (KV pages, plus a state slot on hybrid models)


@dataclass(frozen=True)
class ExpertStats:
    slots: int = 0
    resident: int = 0
    lent_pages: int = 0
    hits: int = 0
    misses: int = 0
    cpu_share: float = 0.0


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
class RequestView:
    id: str
    phase: str  # "queued" | "prefill" | "decode" | "done" | "cancelled" | "error"
    prompt_tokens: int = 0
    output_tokens: int = 0
    tok_s: float = 0.0
    ttft_s: float | None = None
    waited_s: float = 0.0


@dataclass(frozen=True)
class QueueStats:
    pending: tuple[RequestView, ...] = ()
    running: tuple[RequestView, ...] = ()
    recent: tuple[RequestView, ...] = ()


@dataclass(frozen=True)
class Throughput:
    decode_tok_s: float = 0.0
    prefill_tok_s: float = 0.0
    batch: float = 0.0
    interval_s: float = 0.0
    decode_tokens: int = 0  # in the interval
    prefill_tokens: int = 0


@dataclass(frozen=True)
class Counters:
    """Monotonic totals since start (Prometheus counters read these)."""

    requests_done: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


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
    experts: ExpertStats | None = None
    spec: SpecStats | None = None
    queue: QueueStats = field(default_factory=QueueStats)
    throughput: Throughput = field(default_factory=Throughput)
    counters: Counters = field(default_factory=Counters)

    def to_dict(self) -> dict:
        return asdict(self)
