"""Requests panel: throughput sparklines, running requests, the queue and recent completions."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from ninfer_engine.stats import EngineStats, RequestView

from .base import Panel
from .format import count, sparkline
from .history import StatsHistory

PHASE_STYLES = {
    "queued": "yellow3",
    "prefill": "cyan3",
    "decode": "green3",
    "done": "dim",
    "cancelled": "yellow3",
    "error": "red3",
}
RECENT_SHOWN = 5
SPARK_WIDTH = 32


class RequestsPanel(Panel):
    history: reactive[StatsHistory] = reactive(StatsHistory())

    def __init__(self) -> None:
        super().__init__("requests", id="requests")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        tp, totals = stats.throughput, stats.counters
        rates = Text.assemble(
            ("decode  ", "dim"),
            (f"{tp.decode_tok_s:8.1f} tok/s ", "bold green3"),
            sparkline(self.history.decode_tok_s, SPARK_WIDTH, "green3"),
            ("    prefill ", "dim"),
            (f"{tp.prefill_tok_s:8.1f} tok/s ", "bold cyan3"),
            sparkline(self.history.prefill_tok_s, SPARK_WIDTH, "cyan3"),
            ("    batch ", "dim"),
            f"{tp.batch:.1f}",
        )
        since_start = Text.assemble(
            ("since start: ", "dim"),
            f"{count(totals.requests_done)} done  ",
            (f"{count(totals.requests_failed)} failed  ", "red3" if totals.requests_failed else ""),
            f"{count(totals.requests_cancelled)} cancelled   ",
            ("prompt ", "dim"),
            f"{count(totals.prompt_tokens)} tok  ",
            ("generated ", "dim"),
            f"{count(totals.generation_tokens)} tok",
        )
        layout = Table.grid(expand=True, padding=(0, 2))
        layout.add_column(ratio=3)
        layout.add_column(ratio=2)
        layout.add_row(
            running_table(stats.queue.running),
            Group(queue_table(stats.queue.pending), recent_table(stats.queue.recent)),
        )
        return Group(rates, since_start, layout)


def phase(view: RequestView) -> Text:
    return Text(view.phase, style=PHASE_STYLES.get(view.phase, ""))


def ttft(view: RequestView) -> str:
    return "—" if view.ttft_s is None else f"{view.ttft_s:.2f}s"


def new_table(title: str, *columns: str, text_columns: int = 1) -> Table:
    """A borderless table; the first `text_columns` columns are left-aligned, numbers right."""
    table = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        expand=True,
        padding=(0, 1),
        show_edge=False,
        header_style="dim",
    )
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < text_columns else "right", no_wrap=True)
    return table


ID_WIDTH = 12  # request ids are "req_" + 32 hex: the first 8 hex tell requests apart


def short_id(request_id: str) -> str:
    return request_id if len(request_id) <= ID_WIDTH else request_id[: ID_WIDTH - 1] + "…"


def running_table(running: Sequence[RequestView]) -> RenderableType:
    table = new_table(
        f"running ({len(running)})", "id", "phase", "prompt", "out", "tok/s", "TTFT", text_columns=2
    )
    for view in running:
        table.add_row(
            short_id(view.id),
            phase(view),
            count(view.prompt_tokens),
            count(view.output_tokens),
            f"{view.tok_s:.1f}",
            ttft(view),
        )
    if not running:
        table.add_row(Text("idle", style="dim"))
    return table


def queue_table(pending: Sequence[RequestView]) -> RenderableType:
    table = new_table(f"queue ({len(pending)})", "id", "prompt", "waiting")
    for view in pending:
        table.add_row(short_id(view.id), count(view.prompt_tokens), f"{view.waited_s:.1f}s")
    if not pending:
        table.add_row(Text("empty", style="dim"))
    return table


def recent_table(recent: Sequence[RequestView]) -> RenderableType:
    table = new_table("recent", "id", "end", "out", "tok/s", "TTFT", text_columns=2)
    for view in list(recent)[-RECENT_SHOWN:]:
        table.add_row(
            short_id(view.id), phase(view), count(view.output_tokens), f"{view.tok_s:.1f}", ttft(view)
        )
    if not recent:
        table.add_row(Text("none yet", style="dim"))
    return table
