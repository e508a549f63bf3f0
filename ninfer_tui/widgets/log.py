"""Log tail panel: the newest stderr lines of the server, as many as fit."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

LEVEL_STYLES = {" ERROR ": "red3", " WARNING ": "yellow3", " DEBUG ": "dim"}


class LogPanel(Widget):
    lines: reactive[tuple[str, ...]] = reactive(())

    def __init__(self) -> None:
        super().__init__(id="log", classes="panel")
        self.border_title = "log"

    def render(self) -> RenderableType:
        shown = self.lines[-self.size.height :] if self.size.height else ()
        if not shown:
            return Text("no log lines yet", style="dim")
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, line in enumerate(shown):
            style = next((s for level, s in LEVEL_STYLES.items() if level in line), "")
            text.append(line, style=style)
            if i < len(shown) - 1:
                text.append("\n")
        return text
