"""`StatsHistory`: minutes of one-second buckets behind the console's sparklines.

The app owns one and pushes every polled snapshot into it; panels only read it. Token rates come
from the snapshots' monotonic counters (`interval_throughput`), so a bucket holds what the
engine really did in that second, whatever the poll rate. The history belongs to the console,
not to an engine: it runs on across reloads, and the bucket where one happened is marked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ninfer_engine.stats import EngineStats, interval_throughput

BUCKET_S = 1.0
HISTORY_BUCKETS = 900  # 15 minutes


@dataclass(frozen=True)
class Bucket:
    second: int
    decode_tokens: int = 0
    prefill_tokens: int = 0
    kv_used: float = 0.0  # fraction of the pool, the second's last snapshot
    waiting: int = 0
    batch: float = 0.0
    accepted: int = 0  # speculation, drafted and accepted in the second
    drafted: int = 0
    reload: bool = False  # the engine was replaced (or left READY) in this second


@dataclass(frozen=True)
class StatsHistory:
    buckets: tuple[Bucket, ...] = ()
    last: EngineStats | None = None

    def push(self, stats: EngineStats) -> StatsHistory:
        """The history with `stats` added; a snapshot seen before (same `at`) changes nothing."""
        last = self.last
        if last is not None and stats.at == last.at:
            return self
        second = int(stats.at // BUCKET_S)
        tp = interval_throughput(last, stats) if last is not None else None
        reload = last is not None and (stats.started_at != last.started_at
                                       or stats.live != last.live)
        drafted = accepted = 0
        if stats.spec is not None and last is not None and last.spec is not None:
            drafted = max(stats.spec.drafted - last.spec.drafted, 0)
            accepted = max(stats.spec.accepted - last.spec.accepted, 0) if drafted else 0
        kv = stats.kv.used / stats.kv.total if stats.kv.total and stats.live else 0.0
        buckets = list(self.buckets)
        if buckets and buckets[-1].second == second:
            b = buckets[-1]
        else:
            start = buckets[-1].second + 1 if buckets else second
            buckets += [Bucket(s) for s in range(max(start, second - HISTORY_BUCKETS), second)]
            b = Bucket(second)
            buckets.append(b)
        buckets[-1] = replace(
            b,
            decode_tokens=b.decode_tokens + (tp.decode_tokens if tp and stats.live else 0),
            prefill_tokens=b.prefill_tokens + (tp.prefill_tokens if tp and stats.live else 0),
            kv_used=kv, waiting=len(stats.queue.pending),
            batch=(tp.batch if tp and tp.batch else b.batch) if stats.live else 0.0,
            drafted=b.drafted + drafted, accepted=b.accepted + accepted,
            reload=b.reload or reload,
        )
        return StatsHistory(tuple(buckets[-HISTORY_BUCKETS:]), stats)

    def series(self, name: str, end: int = 0) -> tuple[float, ...]:
        """Per-second values of `name`: "decode" and "prefill" (tok/s), "kv" (0..1), "waiting",
        "batch", "acceptance" (0..1); `end` buckets back from the newest (scrolling)."""
        shown = self.buckets[: len(self.buckets) - end] if end else self.buckets
        pick = {
            "decode": lambda b: b.decode_tokens / BUCKET_S,
            "prefill": lambda b: b.prefill_tokens / BUCKET_S,
            "kv": lambda b: b.kv_used,
            "waiting": lambda b: float(b.waiting),
            "batch": lambda b: b.batch,
            "acceptance": lambda b: b.accepted / b.drafted if b.drafted else 0.0,
        }[name]
        return tuple(pick(b) for b in shown)

    def reloads(self, end: int = 0) -> tuple[bool, ...]:
        shown = self.buckets[: len(self.buckets) - end] if end else self.buckets
        return tuple(b.reload for b in shown)

    @property
    def acceptance(self) -> tuple[float, ...]:
        """Acceptance of the seconds that drafted anything."""
        return tuple(b.accepted / b.drafted for b in self.buckets if b.drafted)
