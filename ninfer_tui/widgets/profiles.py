"""The profile picker: every known profile with its flags; dismisses with the chosen name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option


class ProfilePicker(ModalScreen[str | None]):
    """Choose with the arrows and Enter; Esc dismisses with None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", key_display="Esc")]

    def __init__(self, profiles: Mapping[str, Sequence[str]], current: str | None) -> None:
        super().__init__(classes="modal")
        self.profiles = profiles
        self.current = current

    def compose(self) -> ComposeResult:
        options = []
        for name, flags in self.profiles.items():
            label = Text.assemble(
                (name, "bold"),
                ("  (running)" if name == self.current else "", "green3"),
                "\n",
                (" ".join(flags), "dim"),
            )
            options.append(Option(label, id=name))
        with Vertical(classes="dialog -wide"):
            yield Static("switch profile (the engine reloads with it)", classes="question")
            yield OptionList(*options, id="profiles")
            yield Static("↑/↓ choose · Enter select · Esc cancel", classes="detail")

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
