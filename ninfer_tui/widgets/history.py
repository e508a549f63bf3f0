"""`StatsHistory`: the short per-snapshot history behind the console's sparklines.

The app owns one and pushes every new snapshot into it; panels only read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer_engine.stats import EngineStats

HISTORY_LEN = 120


@dataclass(frozen=True)
class StatsHistory:
    decode_tok_s: tuple[float, ...] = ()
    prefill_tok_s: tuple[float, ...] = ()
    acceptance: tuple[float, ...] = ()  # per snapshot interval, only intervals with drafted tokens
    last: EngineStats | None = None

    def push(self, stats: EngineStats) -> StatsHistory:
        """The history with `stats` appended; a snapshot seen before (same `at`) changes nothing."""
        if self.last is not None and stats.at == self.last.at:
            return self
        acceptance = self.acceptance
        if stats.spec is not None and self.last is not None and self.last.spec is not None:
            drafted = stats.spec.drafted - self.last.spec.drafted
            if drafted > 0:
                accepted = stats.spec.accepted - self.last.spec.accepted
                acceptance = (*acceptance, accepted / drafted)[-HISTORY_LEN:]
        return StatsHistory(
            decode_tok_s=(*self.decode_tok_s, stats.throughput.decode_tok_s)[-HISTORY_LEN:],
            prefill_tok_s=(*self.prefill_tok_s, stats.throughput.prefill_tok_s)[-HISTORY_LEN:],
            acceptance=acceptance,
            last=stats,
        )
