"""KV pages panel: pool occupancy, a compact page map and the pages each request holds."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ninfer_engine.stats import EngineStats, KvStats

from .base import Panel
from .format import count, share_out, short_id, stacked_bar

USED, UNOWNED, LENT, FREE, CACHED = "green3", "dark_green", "magenta", "grey30", "dark_cyan"
# Requests take turns through these so neighbouring runs in the page map stay distinguishable.
REQUEST_STYLES = ("green3", "cyan3", "chartreuse3", "steel_blue1")
MAP_ROWS = 3


class KvPanel(Panel):
    def __init__(self) -> None:
        super().__init__("KV pages", id="kv")

    def render_stats(self, stats: EngineStats) -> RenderableType:
        kv = stats.kv
        if self.compact:
            share = f"{100 * kv.used / kv.total:.0f}% " if kv.total else ""
            return Text.assemble(("KV ", "bold"), share, (f"{count(kv.used)}/{count(kv.total)} "
                                 f"pages of {kv.page_tokens} · {kv.dtype}", "dim"),
                                 (f" · lent {count(kv.lent)}" if kv.lent else "", LENT))
        width = max(10, self.size.width)
        summary = Text.assemble(
            ("used ", "dim"),
            (count(kv.used), USED),
            *((("  cached ", "dim"), (count(kv.cached), CACHED)) if kv.cached else ()),
            ("  free ", "dim"),
            count(kv.free),
            ("  lent ", "dim"),
            (count(kv.lent), LENT),
            ("  total ", "dim"),
            count(kv.total),
        )
        if not kv.total:
            return Group(summary, Text("no KV pool allocated", style="dim"))
        bar = stacked_bar([(kv.used, USED), (kv.cached, CACHED), (kv.lent, LENT),
                           (kv.free, FREE)], width)
        host = host_tier_line(stats)
        return Group(summary, bar, *page_map(kv, width), requests_line(kv),
                     *([host] if host is not None else []))


def host_tier_line(stats: EngineStats) -> Text | None:
    """The prefix cache's host tier, when there is one: pages and snapshots held there, and
    the pages copied back for hits."""
    tree = stats.prefix
    if not tree.host_total and not tree.host_snapshot_total:
        return None
    return Text.assemble(
        ("host tier ", "dim"), f"{count(tree.host_pages)}/{count(tree.host_total)} pages",
        *((("  snapshots ", "dim"),
           f"{count(tree.host_snapshots)}/{count(tree.host_snapshot_total)}")
          if tree.host_snapshot_total else ()),
        ("  restored ", "dim"), count(tree.host_restored_pages))


def page_map(kv: KvStats, width: int) -> list[Text]:
    """Up to MAP_ROWS rows of cells, pages grouped by owner: each request, other used, cached
    by the prefix tree, lent, free.

    The engine reports counts, not page addresses, so the map shows shares, not positions.
    """
    cells = min(kv.total, width * MAP_ROWS)
    owned = sum(pages for _, pages in kv.per_request)
    runs = [(pages, "■", style_of(i)) for i, (_, pages) in enumerate(kv.per_request)]
    runs += [(max(0, kv.used - owned), "■", UNOWNED), (kv.cached, "▪", CACHED),
             (kv.lent, "■", LENT), (kv.free, "·", FREE)]
    flat = Text()
    for (_, glyph, style), n in zip(
        runs, share_out([pages for pages, _, _ in runs], cells), strict=True
    ):
        flat.append(glyph * n, style=style)
    rows = [flat[i : i + width] for i in range(0, len(flat), width)]
    caption = f"one cell ≈ {kv.total / cells:.1f} pages of {kv.page_tokens} tokens · {kv.dtype}"
    rows.append(Text(caption, style="dim"))
    return rows


def requests_line(kv: KvStats) -> Text:
    """`id pages` for every request holding pages, in the map's order and colours."""
    if not kv.per_request:
        return Text("no request holds pages", style="dim")
    line = Text(no_wrap=True, overflow="ellipsis")
    for i, (request_id, pages) in enumerate(kv.per_request):
        line.append(f"{short_id(request_id)} ", style=style_of(i))
        line.append(f"{pages}p   ", style="bold")
    return line


def style_of(index: int) -> str:
    return REQUEST_STYLES[index % len(REQUEST_STYLES)]
