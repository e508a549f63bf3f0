"""SVG snapshots of the console at 80×24, 100×30 and 160×50 in each engine state (ready, busy,
paused with waiters, failed, reloading), plus the modal screens and the other scenarios.

Baselines live in `tests/tui/__snapshots__/`; after a deliberate change to the console, look at
the report and refresh them with `pytest tests/tui --snapshot-update`.
"""

from __future__ import annotations

import pytest

from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import FakeSupervisor, play_all

SIZES = {"80x24": (80, 24), "100x30": (100, 30), "160x50": (160, 50)}
STATES = {"ready": "idle", "busy": "busy8", "paused": "paused", "failed": "failed",
          "reloading": "reloading"}


def console(scenario: str) -> tuple[NinferConsole, FakeSupervisor]:
    feed = FakeSupervisor(scenario)
    return NinferConsole(feed, title_info="ninfer 0.1.0 · fake feed"), feed


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("state", list(STATES))
def test_state(snap_compare, state: str, size: str) -> None:
    app, feed = console(STATES[state])
    assert snap_compare(app, terminal_size=SIZES[size],
                        run_before=lambda pilot: play_all(app, feed))


@pytest.mark.parametrize("scenario", ["cpu_only", "moe_lending", "spec_on"])
def test_scenario(snap_compare, scenario: str) -> None:
    app, feed = console(scenario)
    assert snap_compare(app, terminal_size=SIZES["160x50"],
                        run_before=lambda pilot: play_all(app, feed))


@pytest.mark.parametrize("size", list(SIZES))
def test_help(snap_compare, size: str) -> None:
    app, feed = console("idle")
    assert snap_compare(app, terminal_size=SIZES[size], press=["question_mark"],
                        run_before=lambda pilot: play_all(app, feed))


@pytest.mark.parametrize("size", ["80x24", "160x50"])
def test_failed_with_log(snap_compare, size: str) -> None:
    app, feed = console("failed")
    assert snap_compare(app, terminal_size=SIZES[size], press=["l"],
                        run_before=lambda pilot: play_all(app, feed))


def test_request_detail(snap_compare) -> None:
    app, feed = console("paused")
    assert snap_compare(app, terminal_size=SIZES["100x30"], press=["down", "enter"],
                        run_before=lambda pilot: play_all(app, feed))


def test_profile_picker(snap_compare) -> None:
    app, feed = console("moe_lending")
    assert snap_compare(app, terminal_size=SIZES["160x50"], press=["p"],
                        run_before=lambda pilot: play_all(app, feed))
