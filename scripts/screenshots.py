"""Regenerate `screenshots/*.svg` (and `*.png` when `rsvg-convert` is installed) of the console.

Every scenario of `ninfer_tui.fake_scenarios` is rendered at 140x44, plus the profile picker and the
key help. Run from the repository root: `python scripts/screenshots.py [--out screenshots]`.
PNGs need librsvg (`apt-get install librsvg2-bin`); without it only the SVGs are written.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_tui.app import NinferConsole  # noqa: E402
from ninfer_tui.fake_feed import FakeSupervisor, play_all  # noqa: E402
from ninfer_tui.fake_scenarios import SCENARIOS  # noqa: E402

SIZE = (140, 44)
# (file name, scenario, keys pressed before the picture)
SHOTS = [(name, name, ()) for name in SCENARIOS] + [
    ("failed_log", "failed", ("l",)),
    ("profile_picker", "moe_lending", ("p",)),
    ("help", "idle", ("question_mark",)),
]


async def render(scenario: str, keys: tuple[str, ...]) -> str:
    """The console's SVG for `scenario` after the whole feed was polled and `keys` pressed."""
    feed = FakeSupervisor(scenario)
    app = NinferConsole(feed, title_info="ninfer 0.1.0 · fake feed")
    async with app.run_test(size=SIZE) as pilot:
        play_all(app, feed)
        await pilot.press(*keys)
        await pilot.pause()
        return app.export_screenshot(title=f"ninfer console: {scenario}")


def to_png(svg: Path, png: Path, converter: str) -> None:
    # rsvg collapses the SVG's leading non-breaking spaces unless whitespace is preserved.
    text = svg.read_text().replace("<svg ", '<svg xml:space="preserve" ', 1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg") as tmp:
        tmp.write(text)
        tmp.flush()
        subprocess.run([converter, tmp.name, "-o", str(png)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    converter = shutil.which("rsvg-convert")
    for name, scenario, keys in SHOTS:
        svg = out / f"{name}.svg"
        svg.write_text(asyncio.run(render(scenario, keys)))
        written = [svg.name]
        if converter:
            to_png(svg, svg.with_suffix(".png"), converter)
            written.append(f"{name}.png")
        print(" ".join(written))
    if not converter:
        print("rsvg-convert not found: SVGs only (apt-get install librsvg2-bin for PNGs)")


if __name__ == "__main__":
    main()
