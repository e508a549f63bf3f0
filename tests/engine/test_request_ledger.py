"""`RequestLedger`, the latency block's source (issue 24): p50/p95/p99 of TTFT, ITL, e2e and queue
wait over the last minute, the request rate, ends by reason (429s and queue timeouts by their
codes), and totals that outlive the window. Every figure is checked against hand-computed values.
"""
from __future__ import annotations

from ninfer_engine.request_ledger import RequestLedger, ended_view
from ninfer_engine.types import EngineError, Timings, TokenEvent, Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def served(rid: str, queue_s: float, prefill_s: float, decode_s: float, output: int,
           finish: str = "stop"):
    """A request that ended normally; TTFT = queue + prefill (from arrival), e2e = TTFT + decode."""
    last = TokenEvent(finish=finish, usage=Usage(10, output),
                      timings=Timings(queue_s=queue_s, prefill_s=prefill_s, decode_s=decode_s))
    return ended_view(rid, 10, arrived=0.0, client=None, last=last, now=99.0)


def test_one_request_from_arrival():
    view = served("a", queue_s=0.5, prefill_s=0.25, decode_s=2.0, output=5)
    assert view.ttft_s == 0.75  # queue wait included: the one TTFT definition
    assert view.e2e_s == 2.75 and view.waited_s == 0.5
    assert view.tok_s == 2.0  # 4 gaps over the decode time


def test_percentiles_rate_reasons_and_the_window():
    clock = Clock()
    ledger = RequestLedger(window_s=60.0, clock=clock)
    # ten served requests: TTFT 0.1 .. 1.0 s, queue 0.0 .. 0.9 s, ITL 0.01 .. 0.10 s
    for i in range(10):
        ledger.record(served(f"r{i}", queue_s=i / 10, prefill_s=0.1, decode_s=(i + 1) / 100 * 4,
                             output=5, finish="length" if i == 9 else "stop"))
        clock.now += 1.0
    ledger.rejected("over", "server_overloaded", client=None)
    timeout = TokenEvent(finish="error", usage=Usage(10, 0), timings=Timings(queue_s=30.0),
                         error=EngineError("late", "request_queue_timeout", 503))
    ledger.record(ended_view("late", 10, 0.0, None, timeout, 30.0))

    stats = ledger.latency()
    assert stats.requests == 12
    assert abs(stats.rate_per_s - 12 / 10) < 1e-9  # 10 s since the first end, not a minute
    assert (stats.ttft.p50, stats.ttft.p95, stats.ttft.p99, stats.ttft.n) == (
        0.5, 1.0, 1.0, 10)  # nearest rank: the 5th and the 10th of ten
    assert abs(stats.itl.p50 - 0.05) < 1e-12 and abs(stats.itl.p99 - 0.10) < 1e-12
    assert abs(stats.e2e.p50 - (0.5 + 0.20)) < 1e-12
    # queue wait counts the timed-out request (30 s), not the refused one
    assert stats.queue.n == 11 and stats.queue.p99 == 30.0
    assert dict(stats.outcomes) == {"stop": 9, "length": 1, "server_overloaded": 1,
                                    "request_queue_timeout": 1}

    clock.now += 61.0  # a minute later the window is empty; the totals remain
    later = ledger.latency()
    assert later.requests == 0 and later.ttft.n == 0 and later.outcomes == ()
    assert dict(later.totals) == dict(stats.outcomes)
