"""Trends panel: per-second sparklines of decode and prefill tok/s, KV use, waiting requests and
batch size, over minutes; a yellow bar marks a reload. `[` and `]` scroll back and forth."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive

from ninfer_engine.stats import EngineStats

from .base import Panel
from .format import sparkline
from .history import StatsHistory

# (series, label, style, fixed top or None, how the newest value reads)
SERIES = (
    ("decode", "decode", "green3", None, lambda v: f"{v:.1f} tok/s"),
    ("prefill", "prefill", "cyan3", None, lambda v: f"{v:.0f} tok/s"),
    ("kv", "KV", "magenta", 1.0, lambda v: f"{100 * v:.0f}%"),
    ("waiting", "waiting", "yellow3", None, lambda v: f"{v:.0f}"),
    ("batch", "batch", "dodger_blue2", None, lambda v: f"{v:.1f}"),
)
LABEL_WIDTH = 8
TAIL_WIDTH = 12


class TrendsPanel(Panel):
    history: reactive[StatsHistory] = reactive(StatsHistory())
    scroll_back: reactive[int] = reactive(0)  # buckets hidden at the right (looking back)

    def __init__(self) -> None:
        super().__init__("per second", id="trends")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        width = max(8, self.size.width - LABEL_WIDTH - TAIL_WIDTH)
        history, back = self.history, self.scroll_back
        span = len(history.buckets) - back
        ago = f" · {back} s ago" if back else ""
        self.border_title = f"per second, last {min(span, width)} s{ago}"
        marks = history.reloads(back)
        rows = []
        shown = SERIES[:2] if self.compact else SERIES
        for name, label, style, top, reads in shown:
            values = history.series(name, back)
            line = Text(f"{label:<{LABEL_WIDTH}}", style="dim")
            line.append_text(sparkline(values, width, style, top, marks))
            newest = values[-1] if values and stats.live else None
            line.append(f" {reads(newest) if newest is not None else '—':>{TAIL_WIDTH - 1}}")
            rows.append(line)
        return Group(*rows)
