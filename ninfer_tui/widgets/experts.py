"""Expert cache panel: GPU expert slots, pages lent from the KV pool, hit rate and CPU share."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ninfer_engine.stats import EngineStats

from .base import Panel
from .format import count, fraction_bar, gib, percent

LABEL_WIDTH = 11
TAIL_WIDTH = 8


class ExpertPanel(Panel):
    def __init__(self) -> None:
        super().__init__("expert cache", id="experts")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        experts = stats.experts
        if experts is None:
            return Text("experts: dense model" if self.compact else "dense model, no experts",
                        style="dim")
        shape = Text.assemble((f"{experts.experts}", "bold"), (" routed experts × ", "dim"),
                              (f"{experts.layers}", "bold"), (" layers, ", "dim"),
                              (f"top-{experts.active}", "bold"), (" per token", "dim"))
        if not experts.slots:  # no expert cache: every expert is resident where it runs
            where = "CPU" if experts.cpu_share >= 1.0 else "GPU"
            if self.compact:
                return Text.assemble(("experts ", "bold"), shape, (f", all on the {where}", "dim"))
            return Group(shape, Text(f"all resident on the {where}: no expert cache to fill",
                                     style="dim"))
        if self.compact:
            lookups = experts.hits + experts.misses
            hit = experts.hits / lookups if lookups else 0
            return Text.assemble(("experts ", "bold"), f"{experts.resident}/{experts.slots} slots",
                                 ("  hit ", "dim"), percent(hit),
                                 ("  CPU ", "dim"), percent(experts.cpu_share))
        bar_width = max(10, self.size.width - LABEL_WIDTH - TAIL_WIDTH)
        lookups = experts.hits + experts.misses
        hit_rate = experts.hits / lookups if lookups else 0.0
        resident = experts.resident / experts.slots if experts.slots else 0.0

        def row(label: str, fraction: float, style: str) -> Text:
            line = Text(f"{label:<{LABEL_WIDTH}}")
            line.append_text(fraction_bar(fraction, bar_width, style))
            line.append(f" {percent(fraction):>7}")
            return line

        return Group(
            *([shape] if experts.experts else []),
            Text.assemble(
                ("slots ", "dim"),
                str(experts.slots),
                ("   resident ", "dim"),
                str(experts.resident),
                ("   lent from KV ", "dim"),
                (f"{count(experts.lent_pages)} pages", "magenta"),
            ),
            row("resident", resident, "magenta"),
            row("hit rate", hit_rate, "green3"),
            Text(
                f"{'':<{LABEL_WIDTH}}{count(experts.hits)} hits · {count(experts.misses)} misses"
                + (f" · {gib(experts.bytes_copied)} GiB copied in" if experts.bytes_copied else ""),
                style="dim",
            ),
            row("CPU share", experts.cpu_share, "yellow3"),
            Text(  # the layers that hand some of their misses to the host (`--expert-cpu-share`)
                f"{'':<{LABEL_WIDTH}}"
                + (f"routed-expert work on the CPU, now in {experts.cpu_layers} of "
                   f"{experts.layers} layers" if experts.cpu_layers
                   else "share of routed-expert work computed on the CPU"), style="dim"
            ),
        )
