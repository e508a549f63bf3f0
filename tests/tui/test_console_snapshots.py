"""SVG snapshots of the console for every fake-feed scenario, at a fixed terminal size.

Baselines live in `tests/tui/__snapshots__/`; after a deliberate change to the console, look at
the report and refresh them with `pytest tests/tui --snapshot-update`.
"""

from __future__ import annotations

import pytest

from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import SCENARIOS, FakeSupervisor, play_all

SIZE = (140, 44)


def console(scenario: str) -> tuple[NinferConsole, FakeSupervisor]:
    feed = FakeSupervisor(scenario)
    return NinferConsole(feed, title_info="ninfer 0.1.0 · fake feed"), feed


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario(snap_compare, scenario: str) -> None:
    app, feed = console(scenario)
    assert snap_compare(app, terminal_size=SIZE, run_before=lambda pilot: play_all(app, feed))


def test_failed_with_log(snap_compare) -> None:
    app, feed = console("failed")
    assert snap_compare(
        app, terminal_size=SIZE, press=["l"], run_before=lambda pilot: play_all(app, feed)
    )


def test_profile_picker(snap_compare) -> None:
    app, feed = console("moe_lending")
    assert snap_compare(
        app, terminal_size=SIZE, press=["p"], run_before=lambda pilot: play_all(app, feed)
    )


def test_help(snap_compare) -> None:
    app, feed = console("idle")
    assert snap_compare(
        app,
        terminal_size=SIZE,
        press=["question_mark"],
        run_before=lambda pilot: play_all(app, feed),
    )
