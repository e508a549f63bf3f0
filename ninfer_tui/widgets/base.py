"""`Panel`: the base of every console panel, a bordered widget that renders one `EngineStats`."""

from __future__ import annotations

from rich.console import RenderableType
from textual.reactive import reactive
from textual.widget import Widget

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineState

# What the panels show before the first poll: an engine that is still loading.
NO_STATS = EngineStats(at=0.0, state=EngineState.LOADING.value)


class Panel(Widget):
    """A titled panel; subclasses implement `render_stats` and never reach past the snapshot."""

    stats: reactive[EngineStats] = reactive(NO_STATS, layout=True)

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = title

    def render(self) -> RenderableType:
        return self.render_stats(self.stats)

    def render_stats(self, stats: EngineStats) -> RenderableType:
        raise NotImplementedError
