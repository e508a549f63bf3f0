"""The banner under the header: an engine failure (with what to do) or a load in progress."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineState

from .base import Panel
from .format import percent


class FailureBanner(Panel):
    """Shown only while the engine is failed, loading or reloading; hidden when it is ready."""

    def __init__(self) -> None:
        super().__init__("", id="banner")

    def watch_stats(self, stats: EngineStats) -> None:
        failed = stats.state == EngineState.FAILED.value
        self.set_class(failed, "-failed")
        self.display = failed or stats.admission == "draining" or stats.state in (
            EngineState.LOADING.value,
            EngineState.RELOADING.value,
        )

    def render_stats(self, stats: EngineStats) -> RenderableType:
        if stats.state == EngineState.FAILED.value and self.compact:
            return Text.assemble(("ENGINE FAILED  ", "bold"), ("r", "bold reverse"), " reload  ",
                                 ("l", "bold reverse"), " log  ",
                                 stats.failure or "no reason was reported")
        if stats.state == EngineState.FAILED.value:
            return Text.assemble(
                ("ENGINE FAILED  ", "bold"),
                stats.failure or "no reason was reported",
                "\nQueued and running requests were answered 503. Press ",
                ("r", "bold reverse"),
                " to reload, ",
                ("p", "bold reverse"),
                " to pick another profile, ",
                ("l", "bold reverse"),
                " for the log.",
            )
        if stats.admission == "draining":
            running = len(stats.queue.running)
            return Text.assemble(("DRAINING  ", "bold"), f"{running} running requests may finish; "
                                 "new ones get 503. The console closes when they are done.")
        progress = "" if stats.load_progress is None else f" {percent(stats.load_progress)}"
        return Text.assemble(
            (f"{stats.state.upper()}{progress}  ", "bold"),
            "the server answers 503 service_unavailable until the engine is ready.",
        )
