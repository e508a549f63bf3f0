"""Vision panel, under the state slots (`--vision` only; hidden otherwise): media encoded, the
encoder's time, media tokens prefilled and the encoder-row cache."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ninfer_engine.stats import EngineStats

from .base import Panel
from .format import count, percent


class VisionPanel(Panel):
    def __init__(self) -> None:
        super().__init__("vision", id="vision")

    def watch_stats(self, stats: EngineStats) -> None:
        self.display = stats.vision is not None

    def render_stats(self, stats: EngineStats) -> RenderableType:
        v = stats.vision
        if v is None:
            return Text("vision off", style="dim")
        lookups = v.cache_hits + v.cache_misses
        hit_rate = percent(v.cache_hits / lookups if lookups else 0.0)
        per_item = f"{v.encoder_s / v.encoded * 1000:.0f} ms each" if v.encoded else "—"
        if self.compact:
            return Text.assemble(("vision ", "bold"), f"{count(v.encoded)} encoded",
                                 ("  tokens ", "dim"), count(v.media_tokens),
                                 ("  cache hit ", "dim"), hit_rate)
        return Group(
            Text.assemble(("encoded ", "dim"), (count(v.encoded), "bold"), ("  encoder ", "dim"),
                          f"{v.encoder_s:.2f} s", (f"  ({per_item})", "dim")),
            Text.assemble(("media tokens prefilled ", "dim"), (count(v.media_tokens), "bold")),
            Text.assemble(("cache ", "dim"), f"{v.cache_bytes / 2**20:.0f}/"
                          f"{v.cache_capacity / 2**20:.0f} MiB", ("  hit ", "dim"), hit_rate),
        )
