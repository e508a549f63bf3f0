"""Log panel: the server's stderr lines, scrollable (↑/↓, PgUp/PgDn, mouse) and following the
newest line unless scrolled back; long lines scroll sideways instead of wrapping."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import RichLog

LEVEL_STYLES = {"  ERROR  ": "red3", "  CRITICAL  ": "bold red3", "  WARN  ": "yellow3",
                "  WARNING  ": "yellow3", "  DEBUG  ": "dim"}
MAX_LINES = 2000


class LogPanel(RichLog):
    def __init__(self) -> None:
        super().__init__(id="log", classes="panel", max_lines=MAX_LINES, wrap=False,
                         auto_scroll=True)
        self.border_title = "log (l closes)"
        self.shown: tuple[str, ...] = ()  # the log lines written so far

    def show(self, lines: Sequence[str]) -> None:
        """Show `lines` (the newest tail of the log): only lines not shown yet are written."""
        lines = tuple(lines)
        if lines == self.shown:
            return
        new = lines
        if self.shown and self.shown[-1] in lines:  # the ring moved on: write what follows
            last = len(lines) - 1 - lines[::-1].index(self.shown[-1])
            new = lines[last + 1:]
        else:
            self.clear()
        for line in new:
            style = next((s for level, s in LEVEL_STYLES.items() if level in line), "")
            self.write(Text(line, style=style))
        self.shown = lines
        if not lines:
            self.write(Text("no log lines yet", style="dim"))
