"""The detail of one request (enter on the selected row); `c` cancels it while it lives."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ninfer_engine.stats import RequestView

from .format import count, seconds
from .requests import end_label

LIVE = ("queued", "paused", "prefill", "decode")


def detail_table(view: RequestView, max_context: int) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    used = view.prompt_tokens + view.output_tokens
    context = f"{count(used)} / {count(max_context)} tokens" if max_context else count(used)
    rows = (
        ("id", view.id),
        ("client", view.client or "—"),
        ("state", end_label(view)),
        ("context", context),
        ("prompt", f"{count(view.prompt_tokens)} tokens, {count(view.cached_tokens)} cached"),
        ("output", f"{count(view.output_tokens)} tokens at {view.tok_s:.1f} tok/s"),
        ("queue wait", seconds(view.waited_s)),
        ("TTFT", seconds(view.ttft_s)),
        ("end to end", seconds(view.e2e_s)),
        ("reason", view.reason or "—"),
    )
    for label, value in rows:
        table.add_row(label, value)
    return table


class RequestDetail(ModalScreen[bool]):
    """Dismisses with True when the operator asked to cancel the request."""

    BINDINGS = [Binding("escape,enter", "close", "Close", key_display="Esc"),
                Binding("c", "cancel_request", "Cancel request", key_display="c")]

    def __init__(self, view: RequestView, max_context: int) -> None:
        super().__init__(classes="modal")
        self.view = view
        self.max_context = max_context

    def compose(self) -> ComposeResult:
        live = self.view.phase in LIVE
        hint = "c cancels it (503 to its client) · Esc closes" if live else "Esc closes"
        with Vertical(classes="dialog"):
            yield Static("request", classes="question")
            yield Static(detail_table(self.view, self.max_context))
            yield Static(Text(hint, style="dim"), classes="detail")

    def action_close(self) -> None:
        self.dismiss(False)

    def action_cancel_request(self) -> None:
        self.dismiss(self.view.phase in LIVE)
