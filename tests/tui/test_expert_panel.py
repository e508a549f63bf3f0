"""The expert panel over an expert-slot cache's figures (what `ExpertTiers.stats` publishes):
slots, residents, lent pages, hit rate, CPU share and the bytes copied in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ninfer_engine.stats import ExpertStats
from ninfer_tui.app import NinferConsole
from ninfer_tui.fake_feed import FakeSupervisor
from ninfer_tui.widgets.experts import ExpertPanel

from tests.tui.test_state_slots import SIZE, shown

pytestmark = pytest.mark.anyio


async def panel_text(experts: ExpertStats) -> str:
    """The expert panel's lines on the console over one frame of the busy feed with `experts`."""
    feed = FakeSupervisor("busy8", frames=1)
    feed.frames = (replace(feed.frames[-1], experts=experts),)
    app = NinferConsole(feed, title_info="test")
    async with app.run_test(size=SIZE) as pilot:
        app.poll_supervisor()
        await pilot.pause()
        return "\n".join(shown(app.query_one(ExpertPanel)))


async def test_the_panel_shows_the_slot_cache() -> None:
    text = await panel_text(ExpertStats(
        slots=96, resident=90, cached=90, lent_pages=12, hits=900, misses=100, cpu_share=0.25,
        bytes_copied=3 * 2**30, experts=512, active=10, layers=16))
    assert "512 routed experts × 16 layers, top-10 per token" in text
    assert "slots 96   resident 90   lent from KV 12 pages" in text
    assert "900 hits · 100 misses · 3.0 GiB copied in" in text
    assert "90.0%" in text and "25.0%" in text  # hit rate, CPU share
    assert "share of routed-expert work computed on the CPU" in text  # no layer is counted


async def test_the_panel_counts_the_layers_sharing_with_the_cpu() -> None:
    text = await panel_text(ExpertStats(slots=96, resident=90, cached=90, hits=900, misses=100,
                                        cpu_share=0.2, experts=512, active=10, layers=16,
                                        cpu_layers=5))
    assert "routed-expert work on the CPU, now in 5 of 16 layers" in text
