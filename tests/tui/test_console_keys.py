"""Behaviour of every console key against the fake supervisor, through `App.run_test()`."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList

from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import FakeSupervisor, play_all
from ninfer_tui.widgets.header import HeaderPanel
from ninfer_tui.widgets.log import LogPanel
from ninfer_tui.widgets.memory import MemoryPanel
from ninfer_tui.widgets.modals import ConfirmScreen, HelpScreen, NoticeScreen
from ninfer_tui.widgets.profiles import ProfilePicker
from ninfer_tui.widgets.trends import TrendsPanel

SIZE = (140, 44)
pytestmark = pytest.mark.anyio


def console(
    scenario: str, feed: FakeSupervisor | None = None
) -> tuple[NinferConsole, FakeSupervisor]:
    """The console on a fake feed of `scenario` (or on `feed`, a customised fake)."""
    feed = feed or FakeSupervisor(scenario)
    return NinferConsole(feed, title_info="test"), feed


async def choose_profile(pilot: Pilot, name: str) -> None:
    await pilot.press("p")
    assert isinstance(pilot.app.screen, ProfilePicker)
    options = pilot.app.screen.query_one(OptionList)
    options.highlighted = options.get_option_index(name)
    await pilot.press("enter")


async def test_panels_follow_the_polled_snapshot() -> None:
    app, feed = console("busy8")
    async with app.run_test(size=SIZE):
        play_all(app, feed)
        assert app.stats == feed.frames[-1]
        assert app.query_one(MemoryPanel).stats == feed.frames[-1]
        # one bucket per second of the feed's clock, the first and last second included
        seconds = int(feed.frames[-1].at) - int(feed.frames[0].at) + 1
        assert len(app.history.buckets) == seconds


async def test_profile_that_cannot_run_shows_the_reason() -> None:
    app, feed = console("busy8")  # one GPU; both profiles need two
    async with app.run_test(size=SIZE) as pilot:
        await choose_profile(pilot, "flash-next")
        assert isinstance(app.screen, NoticeScreen)
        assert "needs 2 CUDA devices" in app.screen.message
        await pilot.press("escape")
        assert not isinstance(app.screen, NoticeScreen)
        assert feed.reloads == []


async def test_profile_that_can_run_reloads_after_confirmation() -> None:
    app, feed = console("idle")
    async with app.run_test(size=SIZE) as pilot:
        await choose_profile(pilot, "flash-next")
        assert isinstance(app.screen, ConfirmScreen)
        assert feed.reloads == []
        await pilot.press("y")
        await app.workers.wait_for_complete()
        assert feed.reloads == ["flash-next"]


async def test_profile_switch_can_be_declined() -> None:
    app, feed = console("idle")
    async with app.run_test(size=SIZE) as pilot:
        await choose_profile(pilot, "27b")
        await pilot.press("n")
        await app.workers.wait_for_complete()
        assert feed.reloads == []


async def test_reload_after_failure_is_immediate() -> None:
    app, feed = console("failed")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await app.workers.wait_for_complete()
        assert not isinstance(app.screen, ConfirmScreen)
        assert feed.reloads == [None]


async def test_reload_while_ready_asks_first() -> None:
    app, feed = console("idle")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        assert feed.reloads == []
        await pilot.press("y")
        await app.workers.wait_for_complete()
        assert feed.reloads == [None]


async def test_enter_does_not_confirm_a_reload() -> None:
    """The issue's complaint: Enter confirmed a reload that cuts requests off."""
    app, feed = console("busy8")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        assert not isinstance(app.screen, ConfirmScreen) and feed.reloads == []


class BrokenReload(FakeSupervisor):
    def reload(self, profile: str | None = None) -> None:
        raise RuntimeError("weights file vanished")


async def test_a_failing_reload_is_reported_and_the_console_stays(monkeypatch) -> None:
    app, _ = console("failed", BrokenReload("failed"))
    notes: list[str] = []
    monkeypatch.setattr(app, "notify", lambda message, **kwargs: notes.append(message))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.return_code is None
        assert notes == ["Reload failed: weights file vanished"]


async def test_a_toggles_admission() -> None:
    app, feed = console("busy8")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        assert feed.admission_calls == ["pause"]
        assert app.query_one(HeaderPanel).paused
        await pilot.press("a")
        assert feed.admission_calls == ["pause", "resume"]
        assert not app.query_one(HeaderPanel).paused


async def test_l_toggles_the_log() -> None:
    app, feed = console("failed")
    async with app.run_test(size=SIZE) as pilot:
        log = app.query_one(LogPanel)
        assert not log.display
        await pilot.press("l")
        assert log.display
        assert log.shown == tuple(feed.log_lines())
        assert len(log.shown) == len(log.lines)  # every line written, the newest included
        await pilot.press("l")
        assert not log.display


async def test_question_mark_lists_every_key() -> None:
    app, _ = console("idle")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert [key for key, _, _ in app.screen.keys] == ["p", "r", "a", "↑/↓", "enter", "c",
                                                          "[/]", "l", "s", "?", "q"]
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_s_saves_the_screen_as_svg(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app, feed = console("busy8")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.press("s")
        await pilot.pause()
    (svg,) = tmp_path.glob("ninfer-console-*.svg")
    assert svg.read_text().startswith("<svg") and "READY" in svg.read_text()


async def test_q_quits_at_once_when_idle() -> None:
    app, _ = console("idle")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        assert app.return_code == 0


@pytest.mark.parametrize("key", ["q", "ctrl+q"])
async def test_q_asks_while_requests_run(key: str) -> None:
    """q, and Textual's own ctrl+q, ask before a draining quit (ctrl+q exited at once)."""
    app, feed = console("busy8")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.press(key)
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert app.return_code is None
        await pilot.press("q", "y")
        assert app.return_code == 0


async def test_brackets_scroll_the_history() -> None:
    app, feed = console("busy8", FakeSupervisor("busy8", frames=480))  # two minutes
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert app.scroll_back == 30
        assert app.query_one(TrendsPanel).border_title.endswith("· 30 s ago")
        await pilot.press(*["left_square_bracket"] * 4)
        assert app.scroll_back == len(app.history.buckets) - 10  # never past the oldest
        await pilot.press(*["right_square_bracket"] * 5)
        await pilot.pause()
        assert app.scroll_back == 0 and "ago" not in app.query_one(TrendsPanel).border_title


async def test_the_log_scrolls_at_80x24() -> None:
    """The log view opens at its newest line and PgUp / ↑ scroll it back (not the requests)."""
    feed = FakeSupervisor("failed")
    feed.log = tuple(f"12:00:{i % 60:02d} INFO  line {i}" for i in range(200))
    app, _ = console("failed", feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        log = app.query_one(LogPanel)
        selected = app.selected
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y  # the newest shown
        await pilot.press("pageup")
        await pilot.pause()
        paged = log.scroll_y
        assert paged <= log.max_scroll_y - log.size.height + 2
        await pilot.press("up")
        await pilot.pause()
        assert log.scroll_y == paged - 1 and app.selected == selected
