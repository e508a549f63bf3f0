"""Text helpers shared by the panels: sizes, durations, bars and sparklines as Rich `Text`."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

GIB = 1024**3
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def gib(n_bytes: int) -> str:
    """`n_bytes` in GiB with one decimal, e.g. `15.9`."""
    return f"{n_bytes / GIB:.1f}"


def duration(seconds: float) -> str:
    """A compact duration: `42s`, `3m 07s`, `1h 02m 03s`, `2d 04h`."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m {s:02d}s"
    if minutes:
        return f"{minutes}m {s:02d}s"
    return f"{s}s"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def count(n: float) -> str:
    """Thousands with a k/M suffix so counters fit narrow columns."""
    if n >= 10_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 100_000:
        return f"{n / 1e3:.0f}k"
    return f"{n:,.0f}"


def share_out(amounts: Sequence[int], cells: int) -> list[int]:
    """Split `cells` in proportion to `amounts` (largest remainder), so the parts sum to `cells`."""
    total = sum(amounts)
    if total <= 0:
        return [0] * len(amounts)
    exact = [amount * cells / total for amount in amounts]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(amounts)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[: cells - sum(shares)]:
        shares[i] += 1
    return shares


def stacked_bar(parts: Sequence[tuple[int, str]], width: int, empty: str = "grey30") -> Text:
    """A bar `width` cells wide, its segments proportional to `parts` ((amount, style), ...)."""
    if sum(amount for amount, _ in parts) <= 0:
        return Text("░" * max(0, width), style=empty)
    bar = Text()
    for (_, style), n in zip(parts, share_out([amount for amount, _ in parts], width), strict=True):
        bar.append("█" * n, style=style)
    return bar


def fraction_bar(fraction: float, width: int, style: str) -> Text:
    """A one-colour bar filled to `fraction` (0..1), the rest shaded."""
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "grey30"))


def sparkline(values: Sequence[float], width: int, style: str, top: float | None = None,
              marks: Sequence[bool] = ()) -> Text:
    """The last `width` values as block characters, scaled to `top` (default: their maximum).

    Shorter histories are padded on the left so the newest value is always at the right edge;
    a value whose `marks` entry is true (a reload) is drawn as a yellow bar instead.
    """
    shown = list(values)[-width:] if width > 0 else []
    marked = list(marks)[-len(shown):] if marks and shown else [False] * len(shown)
    peak = top if top is not None else max(shown, default=0.0)
    line = Text(" " * (width - len(shown)))
    for v, mark in zip(shown, marked):
        if mark:
            line.append("│", style="bold yellow3")
            continue
        level = 0 if peak <= 0 else round(max(0.0, min(1.0, v / peak)) * (len(SPARK_BLOCKS) - 1))
        line.append(SPARK_BLOCKS[level], style=style if v > 0 else "grey30")
    return line


def seconds(s: float | None) -> str:
    """A latency: `—`, `85 ms`, `1.24 s`, `12.3 s`."""
    if s is None:
        return "—"
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def short_id(request_id: str, width: int = 8) -> str:
    """The part of a request id that tells requests apart: `req_0a1b2c3d4e…` -> `0a1b2c3d`."""
    core = request_id.split("_", 1)[-1].split("-", 1)[-1] if len(request_id) > width else request_id
    return core[:width]
