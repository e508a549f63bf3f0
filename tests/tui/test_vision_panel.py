"""The vision panel: hidden without `--vision` (every scenario of the fake feed), shown with the
snapshot's vision figures under the state slots when the engine has a tower."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ninfer_engine.stats import VisionStats
from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import FakeSupervisor, play_all
from ninfer_tui.widgets.slots import StateSlotPanel
from ninfer_tui.widgets.vision import VisionPanel
from tests.tui.test_state_slots import SIZE, shown

pytestmark = pytest.mark.anyio


async def test_hidden_without_vision() -> None:
    feed = FakeSupervisor("busy8")
    app = NinferConsole(feed, title_info="test")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.pause()
        assert not app.query_one(VisionPanel).display
        assert "vision" not in app.export_screenshot()


async def test_shows_encoder_work_and_cache() -> None:
    frame = replace(FakeSupervisor("busy8").frames[-1], vision=VisionStats(
        encoded=12, encoder_s=1.5, media_tokens=12288, cache_hits=3, cache_misses=12,
        cache_bytes=40 << 20, cache_capacity=1024 << 20))
    feed = FakeSupervisor("busy8", frames=1)
    feed.frames = (frame,)
    app = NinferConsole(feed, title_info="test")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.pause()
        await pilot.pause()  # the layout after the panel is shown
        panel = app.query_one(VisionPanel)
        assert panel.display
        lines = shown(panel)
        text = "\n".join(lines)
        assert "vision" in lines[0] and "encoded 12  encoder 1.50 s  (125 ms each)" in text
        assert "media tokens prefilled 12,288" in text
        assert "cache 40/1024 MiB  hit 20.0%" in text
        assert panel.region.y == app.query_one(StateSlotPanel).region.bottom
