"""Requests panel: running requests, the queue (paused waiters included) and recent ends with
their reasons; the selected request (↑/↓) is highlighted, `enter` details it, `c` cancels it.

Ids are shown short (`short_id`); TTFT and waits count from each request's arrival.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from ninfer_engine.stats import EngineStats, RequestView

from .base import Panel
from .format import count, seconds, short_id
from .latency import SHORT, outcome_text

PHASE_STYLES = {
    "queued": "yellow3",
    "paused": "orange3",
    "prefill": "cyan3",
    "decode": "green3",
    "stop": "dim",
    "length": "dim",
    "cancelled": "yellow3",
    "error": "red3",
    "rejected": "red3",
}
RECENT_SHOWN = 5


def selectable(stats: EngineStats) -> list[RequestView]:
    """The requests the cursor moves over, in the order shown: running, waiting, recent."""
    queue = stats.queue
    return [*queue.running, *queue.pending, *reversed(list(queue.recent)[-RECENT_SHOWN:])]


def end_label(view: RequestView) -> Text:
    """What a request is doing, or how it ended: `stop`, `length`, `queue timeout`, …"""
    if view.phase in ("error", "rejected", "cancelled") and view.reason:
        return Text(SHORT.get(view.reason, view.reason), style=PHASE_STYLES[view.phase])
    return Text(view.phase, style=PHASE_STYLES.get(view.phase, ""))


class RequestsPanel(Panel):
    selected: reactive[str | None] = reactive(None)  # the id under the cursor

    def __init__(self) -> None:
        super().__init__("requests", id="requests")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        queue = stats.queue
        totals = Text("since start: ", style="dim")
        totals.append_text(outcome_text(stats.latency.totals))
        if not stats.latency.totals:
            totals = Text("since start: no request yet", style="dim")
        mark = self.selected
        running = running_table(queue.running, mark)
        side = Group(queue_table(queue.pending, mark, stats.admission),
                     recent_table(queue.recent, mark))
        if self.size.width < 110:  # stacked: each table gets the whole width
            return Group(totals, running, side)
        layout = Table.grid(expand=True, padding=(0, 2))
        layout.add_column(ratio=1)
        layout.add_column(ratio=1)
        layout.add_row(running, side)
        return Group(totals, layout)


def new_table(title: str, *columns: str, text_columns: int = 1) -> Table:
    """A borderless table; the first `text_columns` columns are left-aligned, numbers right."""
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  expand=True, padding=(0, 1), show_edge=False, header_style="dim")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < text_columns else "right", no_wrap=True)
    return table


def _row_style(view: RequestView, selected: str | None) -> str:
    return "reverse" if view.id == selected else ""


def running_table(running: Sequence[RequestView], selected: str | None) -> RenderableType:
    table = new_table(f"running ({len(running)})", "id", "phase", "prompt", "out", "tok/s",
                      "TTFT", text_columns=2)
    for view in running:
        table.add_row(short_id(view.id), end_label(view), count(view.prompt_tokens),
                      count(view.output_tokens), f"{view.tok_s:.1f}", seconds(view.ttft_s),
                      style=_row_style(view, selected))
    if not running:
        table.add_row(Text("idle", style="dim"))
    return table


def queue_table(pending: Sequence[RequestView], selected: str | None,
                admission: str) -> RenderableType:
    title = f"waiting ({len(pending)})" + (" · admission paused" if admission == "paused" else "")
    table = new_table(title, "id", "state", "prompt", "waited", text_columns=2)
    for view in pending:
        table.add_row(short_id(view.id), end_label(view), count(view.prompt_tokens),
                      seconds(view.waited_s), style=_row_style(view, selected))
    if not pending:
        table.add_row(Text("none", style="dim"))
    return table


def recent_table(recent: Sequence[RequestView], selected: str | None) -> RenderableType:
    table = new_table("recent", "id", "end", "out", "tok/s", "TTFT", text_columns=2)
    for view in reversed(list(recent)[-RECENT_SHOWN:]):  # newest first
        table.add_row(short_id(view.id), end_label(view), count(view.output_tokens),
                      f"{view.tok_s:.1f}", seconds(view.ttft_s), style=_row_style(view, selected))
    if not recent:
        table.add_row(Text("none yet", style="dim"))
    return table
