"""Small modal screens: a yes/no confirmation, a notice and the key help."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Asks one question; dismisses with True for yes (y) and False for no (n, Esc, Enter)."""

    AUTO_FOCUS = "#no"  # Enter must not confirm something that cuts requests off

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", key_display="y"),
        Binding("n,escape", "answer(False)", "No", key_display="n"),
    ]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__(classes="modal")
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="question")
            if self.detail:
                yield Static(self.detail, classes="detail")
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="warning", id="yes")
                yield Button("No (n)", id="no")

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class NoticeScreen(ModalScreen[None]):
    """Tells the operator something, e.g. why a profile cannot run; Esc, Enter or o closes it."""

    BINDINGS = [Binding("escape,enter,o", "close", "OK", key_display="Esc")]

    def __init__(self, title: str, message: str) -> None:
        super().__init__(classes="modal")
        self.notice_title = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -notice"):
            yield Static(self.notice_title, classes="question")
            yield Static(self.message, classes="detail")
            with Horizontal(classes="buttons"):
                yield Button("OK", id="ok")

    @on(Button.Pressed)
    def pressed(self) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Lists the console's keys: (key, name, what it does) rows given by the app."""

    BINDINGS = [Binding("escape,question_mark,enter", "close", "Close", key_display="Esc")]

    def __init__(self, keys: Sequence[tuple[str, str, str]]) -> None:
        super().__init__(classes="modal")
        self.keys = keys

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(justify="center", min_width=3)
        table.add_column(style="bold")
        table.add_column()
        for key, name, description in self.keys:
            table.add_row(Text(f" {key} ", style="bold reverse"), name, description)
        with Vertical(classes="dialog -wide"):
            yield Static("keys", classes="question")
            yield Static(table)
            yield Static(Text("Esc closes this help.", style="dim"), classes="detail")

    def action_close(self) -> None:
        self.dismiss(None)
