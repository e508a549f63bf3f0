"""Latency panel: TTFT, inter-token, end-to-end and queue wait over the last minute, the request
rate, and how requests ended (refusals and errors with their reasons).

Every figure is the supervisor's `LatencyStats`, counted from each request's arrival; the same
numbers are in `/metrics` (`ninfer:request_latency_window_seconds`) and the log lines.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ninfer_engine.stats import EngineStats, LatencyStats

from .base import Panel
from .format import count, seconds

ROWS = (("TTFT", "ttft"), ("ITL", "itl"), ("e2e", "e2e"), ("queue", "queue"))
# error codes shown by a short name; others by their code
SHORT = {"server_overloaded": "429 overloaded", "request_queue_timeout": "queue timeout",
         "client_disconnected": "client left", "service_unavailable": "503 unavailable",
         "cancelled_by_operator": "cancelled by you"}
GOOD = ("stop", "length")


def outcome_text(outcomes: tuple[tuple[str, int], ...]) -> Text:
    """`stop 12 · length 3 · 429 overloaded 2 · queue timeout 4` (problems in colour)."""
    line = Text()
    for i, (name, n) in enumerate(outcomes):
        if i:
            line.append(" · ", style="dim")
        style = "" if name in GOOD else "yellow3" if name == "cancelled" else "red3"
        line.append(f"{SHORT.get(name, name)} ", style=style or "dim")
        line.append(count(n), style="bold " + style if style else "bold")
    if not outcomes:
        line.append("no request ended in the window", style="dim")
    return line


def quantile_table(latency: LatencyStats) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    for _ in range(3):
        table.add_column(justify="right")
    table.add_row("", Text("p50", style="dim"), Text("p95", style="dim"), Text("p99", style="dim"))
    for label, name in ROWS:
        p = getattr(latency, name)
        cells = [seconds(v) if p.n else "—" for v in (p.p50, p.p95, p.p99)]
        table.add_row(label, *cells)
    return table


class LatencyPanel(Panel):
    def __init__(self) -> None:
        super().__init__("latency (last 60 s)", id="latency")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        latency = stats.latency
        self.border_title = f"latency (last {latency.window_s:.0f} s)"
        rate = Text.assemble((f"{latency.rate_per_s:.2f}", "bold"), (" req/s  ", "dim"),
                             (count(latency.requests), "bold"), (" ended", "dim"))
        if self.compact:  # the problems first: they are what a narrow screen must not lose
            t = latency.ttft
            problems = tuple(o for o in latency.outcomes if o[0] not in GOOD)
            return Text.assemble(("last min ", "bold"), ("TTFT p50/p99 ", "dim"),
                                 seconds(t.p50 if t.n else None), "/",
                                 seconds(t.p99 if t.n else None), "  ",
                                 outcome_text(problems) if problems else "", "  ", rate)
        return Group(quantile_table(latency), rate, outcome_text(latency.outcomes))
