"""When speculation pays: the engine's own step times decide, per batch size.

A verify row costs more than a decode row (the H200, 35B-A3B fp8-row: a 1 + 3-token verify step
is ~2× a decode step at batch 1, ~2.6× at batch 8, where its tokens read the union of many more
experts), so drafts pay only while enough of them are taken: 2.4 tokens a round was 1.00× plain
decode at batch 1 and 0.64× at batch 8 (`bench/results/h200-ninfer-bench-35b-a3b-fp8.md`).
Where the break-even lies depends on the model, the batch, the context and the drafter, so
`SpecPolicy` measures instead of modelling: for each batch-size bucket it keeps a moving average
of tokens per second over plain steps and over verify steps (the whole step: drafting, forward,
acceptance), and a step drafts while verify steps have been the faster. The losing side is
still tried once in a while and that probe replaces its stale average, so the choice follows
acceptance as it changes (a lucky probe is corrected by the next steps, which then measure that
side every step); a bucket not yet measured both ways tries both. The first probe comes `PROBE`
steps after the choice, and each probe that finds its side still losing doubles the wait for
the next, up to `PROBE_MAX`: a probe of a 0.64× verify step every 32 steps cost its bucket
1.1 % (35B-A3B fp8-row, batch 8, 2.4 tokens a round: 0.99× plain decode under the policy,
bench/results/h200-ninfer-bench-35b-a3b-fp8.md), one every 512 costs 0.07 %, and a change of
acceptance is seen within 512 steps (~1 s at batch 8).
"""
from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.2  # weight of the newest step in a moving average (~the last 10 steps)
PROBE = 32  # a losing side is tried again after this many steps of its bucket,
PROBE_MAX = 512  # the wait doubling, up to this, each time a probe finds it still losing
MARGIN = 1.02  # verify steps must beat plain ones by 2 % (the averages are noisy)


def bucket(batch: int) -> int:
    """Batch sizes 1, 2, 3-4, 5-8, 9-16, ... share an estimate."""
    return max(batch - 1, 0).bit_length()


@dataclass
class _Rates:
    plain: float | None = None  # tokens/s, moving averages
    verify: float | None = None
    since_probe: int = 0
    every: int = PROBE  # steps between probes of the losing side
    probing: bool = False  # the step now running is a probe of the losing side

    @property
    def verify_wins(self) -> bool:
        """Verify steps beat plain ones by `MARGIN` (both measured)."""
        return self.verify >= MARGIN * self.plain


class SpecPolicy:
    """`speculate(batch)` before a step, `record(batch, verified, tokens, seconds)` after it."""

    def __init__(self) -> None:
        self._buckets: dict[int, _Rates] = {}
        self.skipped = 0  # steps that decoded plainly because verify steps were slower

    def speculate(self, batch: int) -> bool:
        r = self._buckets.setdefault(bucket(batch), _Rates())
        if r.verify is None or r.plain is None:  # measure both sides first
            return r.verify is None
        wins = r.verify_wins
        r.since_probe += 1
        if r.since_probe >= r.every:  # try the losing side again
            r.since_probe, r.probing = 0, True
            return not wins
        if not wins:
            self.skipped += 1
        return wins

    def record(self, batch: int, verified: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0 or tokens <= 0:
            return
        r = self._buckets.setdefault(bucket(batch), _Rates())
        rate = tokens / seconds
        probe, r.probing = r.probing, False
        old = None if probe else (r.verify if verified else r.plain)  # a probe: fresh
        new = rate if old is None else (1 - ALPHA) * old + ALPHA * rate
        if verified:
            r.verify = new
        else:
            r.plain = new
        if probe:  # still losing: wait twice as long for the next; won: probe the other soon
            r.every = min(2 * r.every, PROBE_MAX) if r.verify_wins != verified else PROBE

    def rates(self, batch: int) -> tuple[float | None, float | None]:
        """(plain, verify) tokens/s of `batch`'s bucket, None where not measured yet."""
        r = self._buckets.get(bucket(batch), _Rates())
        return r.plain, r.verify


class AlwaysSpeculate(SpecPolicy):
    """Every step verifies whatever it costs: `ninfer bench`'s cost curve, and tests of the
    speculation mechanics, whose drafts must not depend on how fast a step ran."""

    def speculate(self, batch: int) -> bool:
        return True


class NeverSpeculate(SpecPolicy):
    """No step verifies: the start-up warm-up's plain steps of a `--spec` engine, which the
    timing policy takes in traffic wherever verify steps lose."""

    def speculate(self, batch: int) -> bool:
        return False
