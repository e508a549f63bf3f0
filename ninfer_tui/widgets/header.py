"""The header bar: which model runs where, the engine state pill and uptime."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineState

from .base import Panel
from .format import duration, percent

PILL_STYLES = {
    EngineState.READY.value: "bold black on green3",
    EngineState.LOADING.value: "bold black on yellow3",
    EngineState.RELOADING.value: "bold black on yellow3",
    EngineState.FAILED.value: "bold white on red3",
    EngineState.STOPPED.value: "bold white on grey42",
}


@dataclass(frozen=True)
class ServerInfo:
    """What does not change while the console runs: where the server listens and what it serves."""

    title_info: str
    artifact: str
    listen_url: str
    auth_enabled: bool


def state_pill(stats: EngineStats) -> Text:
    label = stats.state.upper()
    if stats.state in (EngineState.LOADING.value, EngineState.RELOADING.value):
        if stats.load_progress is not None:
            label += f" {percent(stats.load_progress)}"
    return Text(f" {label} ", style=PILL_STYLES.get(stats.state, "reverse"))


class HeaderPanel(Panel):
    """Two lines: model, state, uptime and admission on top; artifact, profile, address below."""

    paused: reactive[bool] = reactive(False)

    def __init__(self, info: ServerInfo) -> None:
        super().__init__("", id="header")
        self.info = info

    def render_stats(self, stats: EngineStats) -> RenderableType:
        top = Text.assemble(
            ("ninfer ", "bold"),
            (stats.model_id or "(no model yet)", "bold cyan"),
            "  ",
            state_pill(stats),
        )
        if stats.started_at and stats.state == EngineState.READY.value:
            top.append(f"  up {duration(stats.at - stats.started_at)}", style="green")
        if self.paused or stats.admission == "paused":
            top.append("  ")
            top.append(" ADMISSION PAUSED ", style="bold black on orange3")
        elif stats.state == EngineState.READY.value:
            top.append("  admitting requests", style="dim")
        # where and how it listens first: a narrow terminal cuts the artifact path, not these
        details = Text.assemble(
            ("listen ", "dim"),
            self.info.listen_url,
            ("  auth ", "dim"),
            ("on", "green") if self.info.auth_enabled else ("off", "yellow"),
            ("  profile ", "dim"),
            stats.profile or "none",
            ("  artifact ", "dim"),
            self.info.artifact,
        )
        grid = Table.grid(expand=True, padding=(0, 1))  # a gap before the title info
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        # the title info yields first: at most a third of the width (80 columns: 26)
        grid.add_column(justify="right", no_wrap=True, overflow="ellipsis",
                        max_width=max(self.size.width // 3, 10))
        grid.add_row(top, Text(self.info.title_info, style="dim"))
        details.no_wrap, details.overflow = True, "ellipsis"
        grid.add_row(details, "")
        return grid
