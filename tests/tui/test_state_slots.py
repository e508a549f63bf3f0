"""The state slots panel: running and checkpoint slots, used of total, and the prefix checkpoints
of a hybrid model; hidden for an attention-only model, whose `EngineStats` has no slots."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.geometry import Region
from textual.widget import Widget

from ninfer_engine.stats import StateSlotStats
from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import FakeSupervisor, play_all
from ninfer_tui.fake_scenarios import SCENARIOS
from ninfer_tui.widgets.experts import ExpertPanel
from ninfer_tui.widgets.kv import KvPanel
from ninfer_tui.widgets.memory import MemoryPanel
from ninfer_tui.widgets.slots import StateSlotPanel
from ninfer_tui.widgets.spec import SpecPanel

SIZE = (140, 44)
pytestmark = pytest.mark.anyio

# scenario -> (running used/total, checkpoint used/total, prefix checkpoints)
HYBRID = {
    "idle": ("0/1", "3/4", 3),
    "busy8": ("8/8", "5/8", 5),
    "failed": ("0/1", "3/4", 3),
    "moe_lending": ("1/1", "1/1", 1),
    "spec_on": ("2/4", "2/4", 2),
    "reloading": ("8/8", "5/8", 5),
}
ATTENTION_ONLY = ("cpu_only", "paused")


def shown(widget: Widget) -> list[str]:
    """The text of the widget's lines as drawn, border included."""
    width, height = widget.outer_size
    return [strip.text for strip in widget.render_lines(Region(0, 0, width, height))]


def gauge(lines: list[str], kind: str) -> tuple[str, int, int]:
    """The `used/total` tail of the `kind` row, its filled cells and its bar's cells."""
    row = next(line for line in lines if line.startswith(f"│ {kind} "))
    cells = row.count("█") + row.count("░")
    return row.strip("│ ").split()[-1], row.count("█"), cells


def test_every_scenario_is_classified() -> None:
    assert set(HYBRID) | set(ATTENTION_ONLY) == set(SCENARIOS)


@pytest.mark.parametrize("scenario", list(HYBRID))
async def test_hybrid_model_shows_its_slots_and_checkpoints(scenario: str) -> None:
    feed = FakeSupervisor(scenario)
    app = NinferConsole(feed, title_info="test")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.pause()
        panel = app.query_one(StateSlotPanel)
        assert panel.display and panel.region.height == 5
        lines = shown(panel)
        assert "state slots" in lines[0]
        running, checkpoint, checkpoints = HYBRID[scenario]
        for kind, expected in (("running", running), ("checkpoint", checkpoint)):
            tail, filled, cells = gauge(lines, kind)
            assert tail == expected
            used, total = map(int, expected.split("/"))
            assert cells > 30 and filled == round(used / total * cells)
        assert f"prefix checkpoints {checkpoints}   hits 1404k/1934k prompt tok (72.6%)" in lines[3]
        # under the memory panel, its bottom level with the KV panel's; the next row not clipped
        assert panel.region.x == app.query_one(MemoryPanel).region.x
        assert panel.region.bottom == app.query_one(KvPanel).region.bottom
        grid = app.query_one("#panels").region
        for lower in (ExpertPanel, SpecPanel):
            region = app.query_one(lower).region
            assert region.y == panel.region.bottom and grid.contains_region(region)


async def test_attention_only_model_has_no_slot_panel() -> None:
    feed = FakeSupervisor("cpu_only")
    assert feed.frames[-1].state_slots.checkpoints == 1  # KV-only checkpoints, still no slots
    app = NinferConsole(feed, title_info="test")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.pause()
        assert not app.query_one(StateSlotPanel).display
        memory, kv = app.query_one(MemoryPanel).region, app.query_one(KvPanel).region
        assert (memory.y, memory.height) == (kv.y, kv.height)  # the memory panel fills its cell
        assert "state slots" not in app.export_screenshot()


async def test_slot_panel_follows_a_reload_between_model_families() -> None:
    llama = FakeSupervisor("cpu_only").frames[-1]
    # every figure distinct, so a field shown in another's place is caught
    hybrid = replace(FakeSupervisor("busy8").frames[-1], state_slots=StateSlotStats(6, 3, 12, 8, 7))
    feed = FakeSupervisor("cpu_only", frames=1)  # hands out its one frame however often polled
    app = NinferConsole(feed, title_info="test")
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(StateSlotPanel)
        seen = []
        for frame in (llama, hybrid, replace(llama, at=hybrid.at + 1.0)):
            feed.frames = (frame,)
            app.poll_supervisor()
            await pilot.pause()
            if not panel.display:
                seen.append(None)
                continue
            lines = shown(panel)
            tails = [gauge(lines, kind)[0] for kind in ("running", "checkpoint")]
            seen.append((*tails, next(line.split()[3] for line in lines if "prefix" in line)))
        assert seen == [None, ("3/6", "8/12", "7"), None]
