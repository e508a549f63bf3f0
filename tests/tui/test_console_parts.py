"""The console's pure helpers: sparkline history, bar arithmetic and state-slot rows."""

from __future__ import annotations

from dataclasses import replace

from ninfer_engine.stats import Counters, EngineStats, SpecStats, StateSlotStats
from ninfer_tui.widgets.format import duration, share_out, sparkline
from ninfer_tui.widgets.history import StatsHistory
from ninfer_tui.widgets.slots import has_state_slots, slot_row


def frame(at: float, drafted: int, accepted: int, decode: int = 10,
          started: float = 0.0) -> EngineStats:
    """A snapshot at `at` whose engine (started at `started`) has decoded `decode` tokens."""
    return EngineStats(
        at=at,
        state="ready",
        started_at=started,
        spec=SpecStats("mtp", 3, drafted // 3, drafted, accepted),
        counters=Counters(decode_tokens=decode, steps=decode, batch_rows=decode),
    )


def test_history_ignores_a_snapshot_it_has_seen() -> None:
    first = StatsHistory().push(frame(1.0, 30, 20))
    assert first.push(frame(1.0, 30, 20)) is first
    assert len(first.buckets) == 1


def test_history_buckets_hold_what_each_second_decoded() -> None:
    history = StatsHistory()
    for at, decoded in ((1.0, 10), (1.5, 14), (2.2, 30), (2.9, 31), (5.1, 40)):
        history = history.push(frame(at, 0, 0, decoded))
    # seconds 1, 2, 3 (no snapshot: empty), 4 (empty) and 5
    assert history.series("decode") == (4.0, 17.0, 0.0, 0.0, 9.0)
    assert not any(history.reloads())


def test_history_marks_a_reload_and_counts_from_the_new_engine() -> None:
    history = StatsHistory().push(frame(1.0, 0, 0, 500)).push(frame(2.0, 0, 0, 540))
    reloaded = history.push(frame(3.5, 0, 0, 12, started=3.0))
    assert reloaded.series("decode") == (0.0, 40.0, 12.0)  # not 12 - 540
    assert reloaded.reloads() == (False, False, True)


def test_history_keeps_fifteen_minutes_and_scrolls_back() -> None:
    history, decoded = StatsHistory(), 0
    for second in range(1, 1001):  # second s decodes s tokens
        decoded += second
        history = history.push(frame(float(second), 0, 0, decoded))
    values = history.series("decode")
    assert len(values) == 900 and values[0] == 101.0 and values[-1] == 1000.0
    assert history.series("decode", 30)[-1] == 970.0  # `[` once: 30 s back


def test_history_acceptance_is_per_interval() -> None:
    history = StatsHistory().push(frame(1.0, 30, 20)).push(frame(2.0, 60, 50))
    assert history.acceptance == (1.0,)
    idle = history.push(frame(3.0, 60, 50))
    assert idle.acceptance == (1.0,)  # no drafts in the interval: nothing to plot
    after_reload = idle.push(replace(frame(4.0, 3, 1), spec=SpecStats("mtp", 3, 1, 3, 1)))
    assert after_reload.acceptance == (1.0,)  # counters restarted: no meaningful delta


def test_share_out_fills_exactly() -> None:
    for amounts in ([1, 1, 1], [5, 0, 2], [1000, 1, 1], [3]):
        assert sum(share_out(amounts, 40)) == 40
    assert share_out([0, 0], 10) == [0, 0]


def test_sparkline_keeps_newest_at_the_right() -> None:
    line = sparkline([1.0, 2.0, 4.0], 5, "green").plain
    assert line == "  ▃▅█"  # 1/4 and 2/4 of the 8 levels, rounded


def test_duration() -> None:
    assert [duration(s) for s in (42, 187, 3723, 180_000)] == [
        "42s",
        "3m 07s",
        "1h 02m 03s",
        "2d 02h",
    ]


def test_slot_row_is_a_gauge_then_used_of_total() -> None:
    assert slot_row("running", 3, 6, 10, "green3").plain == "running    █████░░░░░   3/6  "
    assert slot_row("checkpoint", 0, 0, 10, "cyan3").plain == "checkpoint no slots"


def test_only_a_model_with_slots_has_state_slots() -> None:
    assert not has_state_slots(StateSlotStats())
    assert not has_state_slots(StateSlotStats(checkpoints=2))  # attention only: KV checkpoints
    assert has_state_slots(StateSlotStats(running_total=1))
    assert has_state_slots(StateSlotStats(checkpoint_total=4))


def test_the_cpu_row_fits_the_memory_panel_at_140_columns() -> None:
    """The real CPU run's row (the screenshot at 140x44 wrapped it): 68 cells inside the panel."""
    from ninfer_engine.stats import DeviceMemory, HostMemory
    from ninfer_tui.widgets.memory import cpu_lines

    host = HostMemory(total=24 << 30, used=6 << 30, process_rss=int(10.5 * 2**30),
                      process_cpu=200.0, machine_cpu=100.0, cpus=16)
    row = cpu_lines(DeviceMemory("cpu", 24 << 30), host, bar_width=44)[-1].plain.rstrip()
    assert row.strip() == "engine RSS 10.5 GiB, CPU 200% (machine 100% of 16 cores)"
    assert len(row) <= 68
