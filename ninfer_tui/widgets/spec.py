"""Speculative decoding panel: acceptance overall, per draft position and over time."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from ninfer_engine.stats import EngineStats

from .base import Panel
from .format import count, fraction_bar, percent, sparkline
from .history import StatsHistory

LABEL_WIDTH = 11
TAIL_WIDTH = 8


class SpecPanel(Panel):
    history: reactive[StatsHistory] = reactive(StatsHistory())

    def __init__(self) -> None:
        super().__init__("speculative decoding", id="spec")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        spec = stats.spec
        if spec is None or spec.backend == "off":
            return Text("speculation off" if self.compact else "off", style="dim")
        if self.compact:
            return Text.assemble(("spec ", "bold"), spec.backend, ("  accept ", "dim"),
                                 percent(spec.acceptance), ("  tok/round ", "dim"),
                                 f"{spec.tokens_per_round:.2f}")
        bar_width = max(10, self.size.width - LABEL_WIDTH - TAIL_WIDTH)
        summary = Text.assemble(
            ("backend ", "dim"),
            (spec.backend, "bold"),
            ("   draft window ", "dim"),
            str(spec.window),
            ("   tokens/round ", "dim"),
            (f"{spec.tokens_per_round:.2f}", "bold"),
            ("   rounds ", "dim"),
            count(spec.rounds),
        )
        overall = Text(f"{'acceptance':<{LABEL_WIDTH}}")
        overall.append_text(fraction_bar(spec.acceptance, bar_width, "green3"))
        overall.append(f" {percent(spec.acceptance):>7}")
        positions = []
        for i, rate in enumerate(spec.per_position, start=1):
            line = Text(f"{'position ' + str(i):<{LABEL_WIDTH}}")
            line.append_text(fraction_bar(rate, bar_width, "cyan3"))
            line.append(f" {percent(rate):>7}")
            positions.append(line)
        trend = Text(f"{'history':<{LABEL_WIDTH}}")
        if self.history.acceptance:
            trend.append_text(sparkline(self.history.acceptance, bar_width, "green3", top=1.0))
            trend.append(f" {percent(self.history.acceptance[-1]):>7}")
        else:
            trend.append("no rounds since the console started", style="dim")
        return Group(summary, overall, *positions, trend)
