"""`Panel`, the base of every console panel (a bordered widget that renders one `EngineStats`),
and `PanelColumn`, panels stacked in one cell of the panel grid."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.containers import Vertical
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineState

# What the panels show before the first poll: an engine that is still loading.
NO_STATS = EngineStats(at=0.0, state=EngineState.LOADING.value)


class Panel(Widget):
    """A titled panel; subclasses implement `render_stats` and never reach past the snapshot.

    `compact` (set by the app on small terminals) asks for a one-line body."""

    stats: reactive[EngineStats] = reactive(NO_STATS, layout=True)
    compact: reactive[bool] = reactive(False, layout=True)

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = title

    def render(self) -> RenderableType:
        body = self.render_stats(self.stats)
        if self.compact and isinstance(body, Text):  # one line means one line: cut, not wrap
            body.no_wrap, body.overflow = True, "ellipsis"
        return body

    def render_stats(self, stats: EngineStats) -> RenderableType:
        raise NotImplementedError


class PanelColumn(Vertical):
    """Panels stacked in one grid cell, measured as the sum of their natural heights.

    The grid sizes an `auto` row by its cells' content heights; a plain `Vertical` measures a
    `1fr` child inconsistently there, so this one adds up its shown children instead. Styled
    `height: 100%` with one child at `1fr`, that child then takes what the row has left.
    """

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        total = 0
        for child in self.displayed_children:
            gutter_width, gutter_height = child.styles.gutter.totals
            total += child.get_content_height(container, viewport, width - gutter_width)
            total += gutter_height
        return total
