"""State slots panel: the recurrent-state slots of a hybrid model and its prefix checkpoints.

A hybrid model (GDN + attention) keeps one recurrent state per running sequence and one per
prefix checkpoint, in a fixed number of device slots of each kind; an attention-only model has
none, and then the panel is hidden rather than shown empty.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ninfer_engine.stats import EngineStats, StateSlotStats

from .base import Panel
from .format import count, fraction_bar, percent

# (kind, as in `ninfer:state_slots_total{kind}`; style); one gauge row each.
KINDS = (("running", "green3"), ("checkpoint", "cyan3"))
LABEL_WIDTH = 11
TAIL_WIDTH = 8


def has_state_slots(slots: StateSlotStats) -> bool:
    """True for a model with recurrent state (any slot of either kind)."""
    return bool(slots.running_total or slots.checkpoint_total)


class StateSlotPanel(Panel):
    """Shown only while the snapshot's model has recurrent-state slots."""

    def __init__(self) -> None:
        super().__init__("state slots", id="slots")

    def watch_stats(self, stats: EngineStats) -> None:
        self.display = has_state_slots(stats.state_slots)

    def render_stats(self, stats: EngineStats) -> RenderableType:
        slots, totals = stats.state_slots, stats.counters
        if self.compact:
            return Text.assemble(("state slots ", "bold"), ("running ", "dim"),
                                 f"{slots.running_used}/{slots.running_total}",
                                 ("  checkpoint ", "dim"),
                                 f"{slots.checkpoint_used}/{slots.checkpoint_total}")
        bar_width = max(10, self.size.width - LABEL_WIDTH - TAIL_WIDTH)
        rows: list[Text] = []
        for kind, style in KINDS:
            used, total = getattr(slots, f"{kind}_used"), getattr(slots, f"{kind}_total")
            rows.append(slot_row(kind, used, total, bar_width, style))
        checkpoints = Text.assemble(
            ("prefix checkpoints ", "dim"), (count(slots.checkpoints), "bold")
        )
        if totals.prefix_cache_queries:
            hits, queries = totals.prefix_cache_hits, totals.prefix_cache_queries
            # prompt tokens of finished requests, as /metrics' prefix_cache_* counters
            checkpoints.append("   hits ", style="dim")
            checkpoints.append(f"{count(hits)}/{count(queries)}")
            checkpoints.append(" prompt tok ", style="dim")
            checkpoints.append(f"({percent(hits / queries)})")
        return Group(*rows, checkpoints)


def slot_row(label: str, used: int, total: int, bar_width: int, style: str) -> Text:
    """`label`, a gauge filled to used/total, then `used/total`."""
    line = Text(f"{label:<{LABEL_WIDTH}}")
    if not total:
        line.append("no slots", style="dim")
        return line
    line.append_text(fraction_bar(used / total, bar_width, style))
    line.append(f" {count(used):>3}/{count(total):<3}")
    return line
